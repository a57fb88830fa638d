"""Container exits as the node's runtime reports them, the moment it does (ADR 0028).

Two streams, over the runtime's socket, one chosen at each connection (`choose_stream`):
containerd's own task events on containerd (any version: upstream of its CRI events, which
the CRI plugin emits only once its own exit handling is done; on containerd 2.4, exit → heard
p50 76 ms against 100 ms in bench/node_latency.py), the CRI's on CRI-O; `prefer="cri"` takes
the CRI stream wherever it is safe to read.

- **CRI `GetContainerEvents`** (runtime.v1), runtime-neutral, what the kubelet's EventedPLEG
  reads: each CONTAINER_STOPPED event carries the container's status (exit code, reason
  OOMKilled, finish time) and its pod's name, namespace and uid. Taken where it broadcasts to
  every subscriber: containerd 2.0 and later, and CRI-O (with `enable_pod_events`).
  containerd 1.7 serves it from one channel its subscribers share: a second reader would
  take events from an EventedPLEG kubelet, so it is not read there.
- **containerd's own task events** (containerd.services.events.v1), broadcast by every
  containerd (1.6, 1.7, 2.x): `/tasks/exit` of a container's init process (an exec's exit,
  such as an exec probe's, names its exec id and is skipped) and `/tasks/oom`; the pod is
  named by the labels the CRI plugin puts on its containers, read by one `Containers.Get`
  when `/containers/create` says the container was made (a thread of its own, so an exit
  never waits behind it), and at the exit only for a container made before this stream
  (the Get at the exit took 10-43 ms in 4 of 20 exits in bench/node_latency.py: containerd
  is busiest then). A SIGKILL's exit (137) with no OOM event yet is published at once when
  its memory cgroup counts no OOM kill (cgroups.py; the host's cgroup tree mounted), and
  otherwise waits up to `oom_wait` for the OOM event that may follow it.
- **gVisor** (the runsc shim, `io.containerd.runsc.v1`: ADR 0033): a pod's containers run
  inside its sandbox's kernel, whose processes (the Sentry, the gofer) sit in the pod's
  cgroup, not the container's; the host's OOM killer takes the whole sandbox, and each of its
  containers exits 128, the shim's code for a status it could not read. So for a runsc
  container the OOM count is read at the pod's cgroup, and a 128 is held for the OOM event as
  a SIGKILL's 137 is.

Read-only in what it asks: Version, the event subscription, Containers.Get, and files in a
read-only cgroup tree. The socket itself grants more (ADR 0028 says what, and what a
compromise of this container means). Blocking gRPC calls in the agent's own threads;
`close()` cancels the stream from any thread.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import grpc
import msgspec

from deathwatch._kube.exits import Exit
from deathwatch.firewall.cgroups import OomKills
from deathwatch.firewall.protos import containerd_pb2, cri_pb2

CRI: Final = "cri"
CONTAINERD: Final = "containerd"
K8S_NAMESPACE: Final = "k8s.io"  # containerd's namespace for the CRI plugin's containers
# the labels the CRI plugin sets on every container it makes (pkg/cri: constants, labels.go)
POD_UID, POD_NAMESPACE, POD_NAME = (
    "io.kubernetes.pod.uid", "io.kubernetes.pod.namespace", "io.kubernetes.pod.name",
)  # fmt: skip
CONTAINER_NAME = "io.kubernetes.container.name"
KIND = "io.cri-containerd.kind"  # "sandbox": the pod's pause container, not one of its own
SIGKILL_EXIT: Final = 137
RUNSC: Final = "io.containerd.runsc.v1"  # gVisor's containerd shim
# gVisor's shim (pkg/shim/v1/proc: internalErrorCode): the status `runsc wait` could not read,
# its sandbox gone (OOM-killed, or SIGKILLed on the host)
RUNSC_UNREAD_EXIT: Final = 128
# Where runtimes put their socket (containerd, k3s and RKE2's containerd, CRI-O), tried in this
# order when none is configured: the first that exists and answers is read (ADR 0031)
SOCKETS: Final = (
    "/run/containerd/containerd.sock",
    "/run/k3s/containerd/containerd.sock",
    "/run/crio/crio.sock",
)
CALL_TIMEOUT: Final = 5.0  # a unary call to the runtime (Version, Containers.Get)
NAMES_KEPT: Final = 4096  # containers' pod names held (deleted ones go at their deletion)
_TASK_EXIT = "containerd.events.TaskExit"
_TASK_OOM = "containerd.events.TaskOOM"
_CREATED = "containerd.events.ContainerCreate"
_DELETED = "containerd.events.ContainerDelete"


class RuntimeUnreadable(Exception):
    """The runtime cannot be read: one line naming the socket and what failed."""


@dataclass(frozen=True, slots=True)
class Runtime:
    """The runtime behind the socket, as it says (CRI Version, or containerd's own)."""

    name: str  # containerd, cri-o, ...: the scheme of the ids the pod's status shows
    version: str
    stream: str  # CRI or CONTAINERD: which event stream this agent reads from it

    @property
    def source(self) -> str:
        return f"{self.name} {self.version} ({self.stream})"


AUTO: Final = "auto"
STREAMS: Final = (AUTO, CRI, CONTAINERD)


def choose_stream(name: str, version: str, prefer: str = AUTO) -> str | None:
    """Which stream to read from this runtime (None: neither is safe to read). `prefer`:
    auto (containerd's task events on containerd, the sooner; CRI elsewhere), cri or
    containerd (each only where it is served and safe to read)."""
    if name == "containerd":
        major = _major(version)
        cri_safe = major is not None and major >= 2
        return CRI if prefer == CRI and cri_safe else CONTAINERD
    if name == "cri-o":
        return CRI
    return None


def _major(version: str) -> int | None:
    digits = version.lstrip("v").split(".", 1)[0]
    return int(digits) if digits.isdigit() else None


def _time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC)


class Stream(Protocol):
    runtime: Runtime

    def exits(self) -> Iterator[Exit]:
        """Each exit of a pod's container as it happens; ends when the stream does."""
        ...

    def close(self) -> None: ...


class _Channel:
    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.channel = grpc.insecure_channel(f"unix://{socket}")

    def unary(self, method: str, request: Any, response: type[Any],
              metadata: tuple[tuple[str, str], ...] = ()) -> Any:  # fmt: skip
        call = self.channel.unary_unary(method, request_serializer=type(request).SerializeToString,
                                        response_deserializer=response.FromString)  # fmt: skip
        try:
            return call(request, timeout=CALL_TIMEOUT, metadata=metadata)
        except grpc.RpcError as exc:
            raise RuntimeUnreadable(f"{self.socket}: {method}: {_said(exc)}") from None

    def close(self) -> None:
        self.channel.close()


def _said(exc: Any) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code is not None else 'error'}: {details}"[:300]


def candidates(socket: str, host_root: str = "") -> list[tuple[str, str]]:
    """Which sockets to try, each as (the host's path, where this container sees it): the one
    configured, or every known one. `host_root`: where the host's /run is mounted, as
    `host_root`/run (empty: the paths are this container's own). /var/run is /run."""
    out = []
    for path in (socket,) if socket else SOCKETS:
        host = "/run/" + path.removeprefix("/var/run/") if path.startswith("/var/run/") else path
        out.append((host, f"{host_root.rstrip('/')}{host}" if host_root else host))
    return out


def connect_any(sockets: list[tuple[str, str]], oom_wait: float, prefer: str = AUTO,
                oom_kills: OomKills | None = None) -> Stream:  # fmt: skip
    """The stream of the first of `sockets` (candidates()) that exists and answers. Raises
    RuntimeUnreadable naming each one tried and why: a wrong or missing socket is said, and
    tried again, never a container that cannot start (ADR 0031)."""
    why = []
    for host, seen in sockets:
        if not os.path.exists(seen):
            why.append(f"{host}: no such socket")
            continue
        try:
            return connect(seen, oom_wait, prefer=prefer, oom_kills=oom_kills)
        except RuntimeUnreadable as exc:
            why.append(str(exc).replace(seen, host))
    raise RuntimeUnreadable("; ".join(why) or "no runtime socket to try")


def connect(socket: str, oom_wait: float, clock: Callable[[], float] = time.monotonic,
            prefer: str = AUTO, oom_kills: OomKills | None = None) -> Stream:  # fmt: skip
    """The stream to read from the runtime behind `socket`. Raises RuntimeUnreadable.
    `oom_kills`: containers' OOM kills as their cgroups count them (None: not mounted)."""
    channel = _Channel(socket)
    try:
        runtime = _runtime(channel, prefer)
    except BaseException:
        channel.close()
        raise
    if runtime.stream == CRI:
        return CriStream(channel, runtime)
    return ContainerdStream(channel, runtime, oom_wait, clock, oom_kills)


def _runtime(channel: _Channel, prefer: str = AUTO) -> Runtime:
    said = channel.unary(
        "/runtime.v1.RuntimeService/Version",
        cri_pb2.VersionRequest(version="v1"),
        cri_pb2.VersionResponse,
    )
    name, version = said.runtime_name, said.runtime_version
    stream = choose_stream(name, version, prefer)
    if stream is None:
        raise RuntimeUnreadable(f"{channel.socket}: runtime {name} {version} has no event "
                                "stream this agent reads (containerd, CRI-O)")  # fmt: skip
    return Runtime(name, version, stream)


class CriStream:
    def __init__(self, channel: _Channel, runtime: Runtime) -> None:
        self.channel, self.runtime = channel, runtime
        self._call: Any = None
        self._lock = threading.Lock()
        self._closed = False

    def exits(self) -> Iterator[Exit]:
        call = self.channel.channel.unary_stream(
            "/runtime.v1.RuntimeService/GetContainerEvents",
            request_serializer=cri_pb2.GetEventsRequest.SerializeToString,
            response_deserializer=cri_pb2.ContainerEventResponse.FromString,
        )(cri_pb2.GetEventsRequest())
        with self._lock:
            self._call = call
            if self._closed:
                call.cancel()
        try:
            for event in call:
                found = cri_exit(event, self.runtime.name)
                if found is not None:
                    yield found
        except grpc.RpcError as exc:
            if not self._closed:
                raise RuntimeUnreadable(
                    f"{self.channel.socket}: GetContainerEvents: {_said(exc)}"
                ) from None
        if not self._closed:
            # CRI-O without enable_pod_events answers with an empty stream at once
            raise RuntimeUnreadable(f"{self.channel.socket}: GetContainerEvents ended (a runtime "
                                "that does not serve container events: CRI-O needs "
                                "enable_pod_events)")  # fmt: skip

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._call is not None:
                self._call.cancel()
        self.channel.close()


def cri_exit(event: Any, runtime: str) -> Exit | None:
    """The exit a CRI container event reports (None: not a stop of a pod's container)."""
    if event.container_event_type != cri_pb2.CONTAINER_STOPPED_EVENT:
        return None
    sandbox = event.pod_sandbox_status
    meta = sandbox.metadata if sandbox is not None else None
    if meta is None or not meta.uid:
        return None
    status = next((s for s in event.containers_statuses if s.id == event.container_id), None)
    if status is None or status.state != cri_pb2.CONTAINER_EXITED:
        return None
    finished = status.finished_at or event.created_at
    return Exit(
        container_id=f"{runtime}://{event.container_id}",
        pod_uid=meta.uid,
        namespace=meta.namespace,
        pod=meta.name,
        container=status.metadata.name if status.metadata is not None else "",
        exit_code=status.exit_code,
        oom=status.reason == "OOMKilled",
        exited_at=_time(finished),
    )


@dataclass(frozen=True, slots=True)
class _Named:
    """Whose container it is, from the labels the CRI plugin set on it."""

    pod_uid: str
    namespace: str
    pod: str
    container: str
    cgroup: str = ""  # its OCI spec's linux.cgroupsPath ("": not said)
    # run in a sandbox's own kernel (gVisor): its processes are in its pod's cgroup
    sandboxed: bool = False


class _Linux(msgspec.Struct):
    cgroupsPath: str = ""  # the OCI spec's name


class _Spec(msgspec.Struct):
    linux: _Linux = msgspec.field(default_factory=_Linux)


_spec = msgspec.json.Decoder(_Spec).decode


def _named_by(container: Any) -> _Named | None:
    """Whose a container (containerd's Containers.Get) is, from its labels, and its cgroup
    from its spec. None: not a pod's own container (a pause container, one the CRI plugin
    did not make)."""
    labels = container.labels
    if labels.get(KIND) == "sandbox" or not labels.get(POD_UID):
        return None
    cgroup = ""
    if container.HasField("spec") and container.spec.type_url.endswith("/Spec"):
        try:
            cgroup = _spec(container.spec.value).linux.cgroupsPath
        except (msgspec.ValidationError, msgspec.DecodeError):
            cgroup = ""  # its exit waits for the OOM event, as without the cgroup tree
    sandboxed = container.HasField("runtime") and container.runtime.name == RUNSC
    return _Named(labels[POD_UID], labels.get(POD_NAMESPACE, ""), labels.get(POD_NAME, ""),
                  labels.get(CONTAINER_NAME, ""), cgroup, sandboxed)  # fmt: skip


class _Names:
    """Containers' pod names, read as each container is made: a thread of its own calls
    `Containers.Get` for each id `made` hands it; `of` answers at once."""

    def __init__(self, get: Callable[[str], Any]) -> None:
        self._get = get  # id -> the container (Containers.Get's); raises RuntimeUnreadable
        self._known: dict[str, _Named | None] = {}
        self._deleted: set[str] = set()  # deleted before they were read: not kept when read
        self._lock = threading.Lock()
        self._ids: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True, name="containerd-names")
        self.thread.start()

    def made(self, cid: str) -> None:
        self._ids.put(cid)

    def deleted(self, cid: str) -> None:
        with self._lock:
            if self._known.pop(cid, self) is self:  # not read (yet, or made before the stream)
                if len(self._deleted) >= NAMES_KEPT:
                    self._deleted.clear()
                self._deleted.add(cid)

    def of(self, cid: str) -> tuple[bool, _Named | None]:
        """Whether it was read, and its name (None: not a pod's container)."""
        with self._lock:
            return cid in self._known, self._known.get(cid)

    def close(self) -> None:
        self._ids.put(None)

    def _read(self) -> None:
        while (cid := self._ids.get()) is not None:
            try:
                named = _named_by(self._get(cid))
            except RuntimeUnreadable:
                continue  # gone already, or the runtime busy: its exit reads it then
            except ValueError:  # grpc: the stream closed its channel meanwhile
                return
            with self._lock:
                if cid in self._deleted:
                    self._deleted.discard(cid)
                    continue
                self._known[cid] = named
                while len(self._known) > NAMES_KEPT:  # deletions missed: the oldest go
                    del self._known[next(iter(self._known))]


@dataclass(slots=True)
class _Held:
    exit: Exit
    heard: float  # monotonic
    until: float  # monotonic: published as it is then, if no OOM came


class ContainerdStream:
    """containerd's task events: exits of containers' init processes, and OOM kills."""

    FILTERS = (
        f'topic=="/tasks/exit",namespace=="{K8S_NAMESPACE}"',
        f'topic=="/tasks/oom",namespace=="{K8S_NAMESPACE}"',
        f'topic=="/containers/create",namespace=="{K8S_NAMESPACE}"',
        f'topic=="/containers/delete",namespace=="{K8S_NAMESPACE}"',
    )

    def __init__(self, channel: _Channel, runtime: Runtime, oom_wait: float,
                 clock: Callable[[], float],
                 oom_kills: OomKills | None = None) -> None:  # fmt: skip
        self.channel, self.runtime, self.oom_wait, self.clock = channel, runtime, oom_wait, clock
        self.oom_kills = oom_kills
        self._call: Any = None
        self._lock = threading.Lock()
        self._closed = False
        self._oom: dict[str, float] = {}  # container id -> when its OOM was heard (monotonic)
        self._held: dict[str, _Held] = {}
        # 137s published as no OOM (when each was heard), for an OOM heard after them (late:
        # the cause was wrong)
        self._unoomed: dict[str, float] = {}
        # the order an OOM came in and its distance from its exit in seconds, told as it is
        # heard (the exits container counts it, so that oom_wait is chosen from what the
        # runtime does): before_exit, after_exit (its exit held for it), late (after the
        # exit was published as no OOM)
        self.on_oom: Callable[[str, float], None] = lambda order, gap: None
        # a SIGKILL's exit with no OOM event yet, by what its cgroup said: none (no OOM kill
        # counted: published at once), counted (held for the event), unread (held)
        self.on_sigkill: Callable[[str, Exit], None] = lambda said, exit: None
        self.names = _Names(self._container)

    def exits(self) -> Iterator[Exit]:
        call = self.channel.channel.unary_stream(
            "/containerd.services.events.v1.Events/Subscribe",
            request_serializer=containerd_pb2.SubscribeRequest.SerializeToString,
            response_deserializer=containerd_pb2.Envelope.FromString,
        )(containerd_pb2.SubscribeRequest(filters=list(self.FILTERS)))
        with self._lock:
            self._call = call
            if self._closed:
                call.cancel()
        # a gRPC stream cannot be waited on with a deadline, and a held exit falls due with
        # no event: one thread reads the stream into a queue, this one waits on the queue
        envelopes: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=_read, args=(call, envelopes), daemon=True,
                         name="containerd-events").start()  # fmt: skip
        while True:
            try:
                item = envelopes.get(timeout=self._next_timeout())
            except queue.Empty:
                item = None
            if isinstance(item, grpc.RpcError):
                if self._closed:
                    return
                raise RuntimeUnreadable(f"{self.channel.socket}: Subscribe: {_said(item)}")
            if isinstance(item, StopIteration):
                break
            if item is not None:
                yield from self._heard(item)
            yield from self._due()
        if not self._closed:
            raise RuntimeUnreadable(f"{self.channel.socket}: the event stream ended")

    def _next_timeout(self) -> float | None:
        if not self._held:
            return None
        return max(0.0, min(h.until for h in self._held.values()) - self.clock())

    def _heard(self, envelope: Any) -> Iterator[Exit]:
        kind = envelope.event.type_url.rsplit("/", 1)[-1]
        now = self.clock()
        if kind == _CREATED:
            self.names.made(containerd_pb2.ContainerCreate.FromString(envelope.event.value).id)
            return
        if kind == _DELETED:
            self.names.deleted(containerd_pb2.ContainerDelete.FromString(envelope.event.value).id)
            return
        if kind == _TASK_OOM:
            oom = containerd_pb2.TaskOOM.FromString(envelope.event.value)
            held = self._held.pop(oom.container_id, None)
            unoomed = self._unoomed.pop(oom.container_id, None)
            if held is not None:
                self.on_oom("after_exit", now - held.heard)
                yield _with_oom(held.exit)
            elif unoomed is not None:
                self.on_oom("late", now - unoomed)
            else:
                self._oom[oom.container_id] = now
            return
        if kind != _TASK_EXIT:
            return
        exit = containerd_pb2.TaskExit.FromString(envelope.event.value)
        if exit.id != exit.container_id:
            return  # an exec's process (an exec probe's): its container runs on
        named = self._named(exit)
        if named is None:
            return
        found, whose = named
        oomed = self._oom.pop(exit.container_id, None)
        killed = found.exit_code == SIGKILL_EXIT or (
            whose.sandboxed and found.exit_code == RUNSC_UNREAD_EXIT
        )
        if oomed is not None:
            self.on_oom("before_exit", now - oomed)
            yield _with_oom(found)
        elif killed and self.oom_wait > 0:
            counted = (
                self.oom_kills.count(whose.cgroup, pod=whose.sandboxed)
                if self.oom_kills is not None
                else None
            )
            if counted == 0:  # no OOM killer took it: the OOM event cannot follow
                self._unoomed[exit.container_id] = now
                yield found
                self.on_sigkill("none", found)  # told once it is on its way
            else:
                self.on_sigkill("unread" if counted is None else "counted", found)
                self._held[exit.container_id] = _Held(found, now, now + self.oom_wait)
        else:
            yield found
        self._forget_old()

    def _due(self) -> Iterator[Exit]:
        now = self.clock()
        for cid, held in list(self._held.items()):
            if held.until <= now:
                del self._held[cid]
                self._unoomed[cid] = held.heard
                yield held.exit

    def _forget_old(self) -> None:
        cut = self.clock() - 60
        if len(self._oom) > 1024:  # an OOM whose exit never came (a killed child process)
            self._oom = {c: t for c, t in self._oom.items() if t >= cut}
        if len(self._unoomed) > 1024:
            self._unoomed = {c: t for c, t in self._unoomed.items() if t >= cut}

    def _named(self, exit: Any) -> tuple[Exit, _Named] | None:
        """The exit named for its pod by its container's labels, and whose it is (its cgroup,
        its runtime); None: not a pod's own container (a pause container, a container the CRI
        plugin did not make, one gone)."""
        read, named = self.names.of(exit.container_id)
        if not read:  # made before this stream (or its read failed): read it now
            try:
                named = _named_by(self._container(exit.container_id))
            except RuntimeUnreadable:
                return None
        if named is None:
            return None
        at = exit.exited_at
        return Exit(
            container_id=f"{self.runtime.name}://{exit.container_id}",
            pod_uid=named.pod_uid,
            namespace=named.namespace,
            pod=named.pod,
            container=named.container,
            exit_code=exit.exit_status,
            exited_at=_time(at.seconds * 1_000_000_000 + at.nanos),
        ), named

    def _container(self, cid: str) -> Any:
        got = self.channel.unary(
            "/containerd.services.containers.v1.Containers/Get",
            containerd_pb2.GetContainerRequest(id=cid),
            containerd_pb2.GetContainerResponse,
            metadata=(("containerd-namespace", K8S_NAMESPACE),),
        )
        return got.container

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._call is not None:
                self._call.cancel()
        self.names.close()
        self.channel.close()


def _with_oom(exit: Exit) -> Exit:
    return Exit(container_id=exit.container_id, pod_uid=exit.pod_uid, namespace=exit.namespace,
                pod=exit.pod, container=exit.container, exit_code=exit.exit_code, oom=True,
                exited_at=exit.exited_at)  # fmt: skip


def _read(call: Any, into: queue.Queue[Any]) -> None:
    """Read a stream into a queue: each message, then how it ended (StopIteration, or the
    gRPC error: its cancellation too)."""
    try:
        for message in call:
            into.put(message)
    except grpc.RpcError as exc:
        into.put(exc)
        return
    into.put(StopIteration())
