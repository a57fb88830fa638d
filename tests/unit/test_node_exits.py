"""The node's exit observer (ADR 0028), up to the real runtimes: the exits Lease's format, the
runtime's two streams read over real gRPC from an in-process server speaking the CRI's and
containerd's wire format (the node lane reads real containerd 1.6 and 2.x), the Lease written
once per batch, and the protos current.

A fake only stands in for the runtime's logic: what it sends is built from the same messages
the real runtimes send (field numbers from their .proto files)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, timestamp_pb2

from deathwatch._kube import exits as wire
from deathwatch._kube.exits import Exit, MalformedExits
from deathwatch._kube.ports import Heartbeat
from deathwatch.firewall import exits as exits_module
from deathwatch.firewall.cgroups import OomKills
from deathwatch.firewall.exits import ExitListener, ExitsMetrics, Publisher
from deathwatch.firewall.protos import containerd_pb2, cri_pb2
from deathwatch.firewall.runtime import (
    CONTAINERD,
    CRI,
    RUNSC,
    SOCKETS,
    ContainerdStream,
    RuntimeUnreadable,
    Stream,
    _Names,
    candidates,
    choose_stream,
    connect,
    connect_any,
    cri_exit,
)
from tests.fakeapi import FakeApi
from tests.kube import wait_for

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
UID = "0c6f2a1e-5b7d-4c1e-9a61-3f2d8e7b9c10"


def an_exit(cid: str = "c1", code: int = 3, at: datetime = NOW, **kw: Any) -> Exit:
    return Exit(container_id=f"containerd://{cid}", pod_uid=UID, namespace="sandboxes",
                pod="sbx-1", container="agent", exit_code=code, exited_at=at, **kw)  # fmt: skip


# --- the Lease's format (deathwatch._kube.exits) --------------------------------------------


def test_exits_round_trip_compactly_and_anything_else_is_one_line() -> None:
    text = wire.encode([an_exit(oom=True)])
    assert wire.decode(text) == [an_exit(oom=True)]
    assert '"id":"containerd://c1"' in text and '"code":3' in text
    for bad in ("{", '[{"id": 3}]', '"x"', '[{"id":"a","uid":"u","ns":"n","pod":"p"}]'):
        with pytest.raises(MalformedExits) as raised:
            wire.decode(bad)
        assert "\n" not in str(raised.value) and str(raised.value).startswith(wire.ANNOTATION)


def test_a_lease_keeps_the_recent_exits_oldest_first_one_per_instance() -> None:
    old = an_exit("old", at=NOW - wire.MAX_AGE - timedelta(seconds=1))
    burst = [an_exit(f"c{i}", at=NOW - timedelta(milliseconds=i)) for i in range(100)]
    kept = wire.kept([old, *burst, an_exit("c0", code=9)], NOW)
    assert len(kept) == wire.KEPT_EXITS
    assert [e.exited_at for e in kept] == sorted(e.exited_at for e in kept)
    assert old not in kept and kept[-1] == an_exit("c0", code=9)  # its latest word


def test_lease_names_fit_an_object_name() -> None:
    assert wire.lease_name("node-a", "rel-exits") == "rel-exits.node-a"
    long = wire.lease_name("n" * 260)
    assert len(long) <= 253 and long.startswith(wire.LEASE_PREFIX + ".")


# --- which stream, from which runtime -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "version", "prefer", "stream"),
    [("containerd", "1.6.20~ds1", "auto", CONTAINERD), ("containerd", "v2.4.2", "auto", CONTAINERD),
     ("containerd", "1.6.20~ds1", "cri", CONTAINERD), ("containerd", "v1.7.29", "cri", CONTAINERD),
     ("containerd", "v2.4.2", "cri", CRI), ("containerd", "2.0.0", "cri", CRI),
     ("containerd", "v2.4.2", "containerd", CONTAINERD), ("cri-o", "1.35.0", "auto", CRI),
     ("cri-o", "1.35.0", "containerd", CRI), ("docker", "28.0", "auto", None),
     ("containerd", "weird", "cri", CONTAINERD)],
)  # fmt: skip
def test_containerds_own_events_first_and_the_cri_stream_only_where_it_reaches_everyone(
    name: str, version: str, prefer: str, stream: str | None
) -> None:
    """On containerd its task events come first (the CRI events follow the CRI plugin's own
    exit handling); the CRI stream when asked for, but never on containerd 1.7, which serves
    it from one channel its readers share: a second reader would take events from an
    EventedPLEG kubelet. CRI-O has only the CRI stream."""
    assert choose_stream(name, version, prefer) == stream


# --- a runtime on a real gRPC socket ---------------------------------------------------------


class Runtime:
    """An in-process gRPC server on a unix socket, answering as a runtime does: Version,
    and the event streams fed from `send`."""

    def __init__(self, path: Path, name: str, version: str) -> None:
        self.name, self.version = name, version
        self.events: list[Any] = []
        self.labels: dict[str, dict[str, str]] = {}
        self.cgroups: dict[str, str] = {}  # id -> its spec's linux.cgroupsPath
        self.runtimes: dict[str, str] = {}  # id -> its shim (io.containerd.runc.v2 if unsaid)
        self.gets: list[str] = []  # the ids Containers.Get was asked for, in order
        self.cond = threading.Condition()
        self.subscriptions: list[Any] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "/runtime.v1.RuntimeService/Version": grpc.unary_unary_rpc_method_handler(
                self._version, cri_pb2.VersionRequest.FromString,
                cri_pb2.VersionResponse.SerializeToString),
            "/runtime.v1.RuntimeService/GetContainerEvents": grpc.unary_stream_rpc_method_handler(
                self._stream, cri_pb2.GetEventsRequest.FromString,
                cri_pb2.ContainerEventResponse.SerializeToString),
            "/containerd.services.events.v1.Events/Subscribe": grpc.unary_stream_rpc_method_handler(
                self._subscribe, containerd_pb2.SubscribeRequest.FromString,
                containerd_pb2.Envelope.SerializeToString),
            "/containerd.services.containers.v1.Containers/Get": grpc.unary_unary_rpc_method_handler(
                self._get, containerd_pb2.GetContainerRequest.FromString,
                containerd_pb2.GetContainerResponse.SerializeToString),
        }  # fmt: skip
        self.server.add_generic_rpc_handlers([_Handlers(handlers)])
        self.socket = str(path)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def stop(self) -> None:
        with self.cond:
            self.events.append(None)
            self.cond.notify_all()
        self.server.stop(0)

    def send(self, event: Any) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def _version(self, request: Any, context: Any) -> Any:
        return cri_pb2.VersionResponse(version="0.1.0", runtime_name=self.name,
                                       runtime_version=self.version, runtime_api_version="v1")  # fmt: skip

    def _get(self, request: Any, context: Any) -> Any:
        meta = dict(context.invocation_metadata())
        assert meta.get("containerd-namespace") == "k8s.io"
        self.gets.append(request.id)
        labels = self.labels.get(request.id)
        if labels is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"container {request.id} not found")
        spec = json.dumps({"ociVersion": "1.1.0", "process": {"args": ["/agent"]},
                           "linux": {"cgroupsPath": self.cgroups.get(request.id, ""),
                                     "namespaces": [{"type": "pid"}]}})  # fmt: skip
        return containerd_pb2.GetContainerResponse(
            container=containerd_pb2.Container(id=request.id, labels=labels, spec=any_pb2.Any(
                type_url="types.containerd.io/opencontainers/runtime-spec/1/Spec",
                value=spec.encode()), runtime=containerd_pb2.ContainerRuntime(
                name=self.runtimes.get(request.id, "io.containerd.runc.v2")))
        )  # fmt: skip

    def _events(self, context: Any) -> Iterator[Any]:
        seen = 0
        while context.is_active():
            with self.cond:
                self.cond.wait_for(lambda n=seen: len(self.events) > n, timeout=0.2)  # type: ignore[misc]
                fresh, seen = self.events[seen:], len(self.events)
            for event in fresh:
                if event is None:
                    return
                yield event

    def _stream(self, request: Any, context: Any) -> Iterator[Any]:
        yield from (e for e in self._events(context)
                    if isinstance(e, cri_pb2.ContainerEventResponse))  # fmt: skip

    def _subscribe(self, request: Any, context: Any) -> Iterator[Any]:
        self.subscriptions.append(list(request.filters))
        yield from (e for e in self._events(context) if isinstance(e, containerd_pb2.Envelope))


class _Handlers(grpc.GenericRpcHandler):
    def __init__(self, handlers: dict[str, Any]) -> None:
        self.handlers = handlers

    def service(self, handler_call_details: Any) -> Any:
        return self.handlers.get(handler_call_details.method)


@pytest.fixture
def runtime(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Runtime]:
    name, version = getattr(request, "param", ("containerd", "1.6.20~ds1"))
    served = Runtime(tmp_path / "runtime.sock", name, version)
    yield served
    served.stop()


def envelope(kind: str, message: Any) -> Any:
    event = any_pb2.Any(type_url=f"containerd.events.{kind}", value=message.SerializeToString())
    topic = {"TaskExit": "/tasks/exit", "TaskOOM": "/tasks/oom",
             "ContainerCreate": "/containers/create",
             "ContainerDelete": "/containers/delete"}[kind]  # fmt: skip
    return containerd_pb2.Envelope(namespace="k8s.io", topic=topic, event=event)


def task_exit(cid: str, code: int, exec_id: str | None = None, at: datetime = NOW) -> Any:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(at)
    return envelope("TaskExit", containerd_pb2.TaskExit(
        container_id=cid, id=exec_id or cid, pid=42, exit_status=code, exited_at=stamp))  # fmt: skip


def pod_labels(container: str = "agent", kind: str = "container") -> dict[str, str]:
    return {"io.kubernetes.pod.uid": UID, "io.kubernetes.pod.namespace": "sandboxes",
            "io.kubernetes.pod.name": "sbx-1", "io.kubernetes.container.name": container,
            "io.cri-containerd.kind": kind}  # fmt: skip


def read(stream: Stream, count: int, timeout: float = 10) -> list[Exit]:
    out: list[Exit] = []

    def run() -> None:
        for e in stream.exits():
            out.append(e)
            if len(out) >= count:
                return

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(timeout)
    stream.close()
    return out


def test_containerd_s_events_name_the_pod_skip_execs_and_pause_containers(runtime: Runtime) -> None:
    runtime.labels = {
        "c1": pod_labels(),
        "pause": pod_labels("", "sandbox"),
        "c2": pod_labels("sidecar"),
    }
    stream = connect(runtime.socket, oom_wait=0.05)
    assert stream.runtime.source == "containerd 1.6.20~ds1 (containerd)"
    runtime.send(task_exit("c1", 1, exec_id="probe-exec"))  # an exec probe's process
    runtime.send(task_exit("pause", 0))
    runtime.send(task_exit("gone", 1))  # a container that is no longer there
    runtime.send(task_exit("c1", 3))
    runtime.send(task_exit("c2", 0, at=NOW + timedelta(seconds=1)))
    got = read(stream, 2)
    assert got == [an_exit("c1", 3),
                   Exit(container_id="containerd://c2", pod_uid=UID, namespace="sandboxes",
                        pod="sbx-1", container="sidecar", exit_code=0,
                        exited_at=NOW + timedelta(seconds=1))]  # fmt: skip
    assert runtime.subscriptions == [['topic=="/tasks/exit",namespace=="k8s.io"',
                                      'topic=="/tasks/oom",namespace=="k8s.io"',
                                      'topic=="/containers/create",namespace=="k8s.io"',
                                      'topic=="/containers/delete",namespace=="k8s.io"']]  # fmt: skip


def test_a_container_made_while_the_stream_is_read_is_named_then_not_at_its_exit(
    runtime: Runtime,
) -> None:
    """Its labels are read when containerd says it was made: its exit asks nothing more (the
    Get at an exit is slowest, containerd handling the same exit), and a deletion forgets it."""
    runtime.labels = {"made": pod_labels(), "pause": pod_labels("", "sandbox"),
                      "older": pod_labels("sidecar"), "gone": pod_labels()}  # fmt: skip
    stream = connect(runtime.socket, oom_wait=0.05)
    got: list[Exit] = []
    reader = threading.Thread(target=lambda: got.extend(stream.exits()), daemon=True)
    reader.start()
    for cid in ("made", "pause", "gone"):
        runtime.send(envelope("ContainerCreate", containerd_pb2.ContainerCreate(id=cid)))
    runtime.send(envelope("ContainerDelete", containerd_pb2.ContainerDelete(id="gone")))
    wait_for(lambda: sorted(runtime.gets) == ["gone", "made", "pause"], timeout=10,
             what="the three containers' labels read at their creation")  # fmt: skip
    del runtime.labels["gone"]  # deleted: an exit now finds nothing (as containerd would say)
    runtime.send(task_exit("made", 3))
    runtime.send(task_exit("pause", 0))
    runtime.send(task_exit("gone", 1))
    runtime.send(task_exit("older", 2))  # made before the stream: read at its exit
    wait_for(lambda: len(got) >= 2, timeout=10, what="two exits named")
    stream.close()
    reader.join(5)
    assert [(e.container_id, e.container, e.exit_code) for e in got] == [
        ("containerd://made", "agent", 3), ("containerd://older", "sidecar", 2)]  # fmt: skip
    assert sorted(runtime.gets) == ["gone", "gone", "made", "older", "pause"]


def test_the_names_thread_ends_quietly_once_its_channel_is_closed() -> None:
    """A reconnection closes the old stream's channel while creations may still be queued:
    grpc then raises ValueError, and the thread ends without a traceback."""
    raised: list[Any] = []
    previous = threading.excepthook
    threading.excepthook = raised.append
    try:

        def closed(cid: str) -> Any:
            raise ValueError("Cannot invoke RPC on closed channel!")

        names = _Names(closed)
        names.made("c1")
        names.thread.join(5)
        assert not names.thread.is_alive()
        assert names.of("c1") == (False, None)
    finally:
        threading.excepthook = previous
    assert raised == []


def test_a_sigkill_waits_briefly_for_its_oom_and_an_oom_first_is_remembered(
    runtime: Runtime,
) -> None:
    runtime.labels = {c: pod_labels() for c in ("killed", "oom-after", "oom-before")}
    stream = connect(runtime.socket, oom_wait=0.3)
    started = time.monotonic()
    runtime.send(task_exit("killed", 137))  # SIGKILL, no OOM: published once the wait ends
    runtime.send(task_exit("oom-after", 137))
    runtime.send(envelope("TaskOOM", containerd_pb2.TaskOOM(container_id="oom-after")))
    runtime.send(envelope("TaskOOM", containerd_pb2.TaskOOM(container_id="oom-before")))
    runtime.send(task_exit("oom-before", 137))
    got = read(stream, 3)
    assert [(e.container_id.split("//")[1], e.oom) for e in got] == [
        ("oom-after", True), ("oom-before", True), ("killed", False)]  # fmt: skip
    assert time.monotonic() - started >= 0.3  # the plain kill waited out its window


def test_a_sigkill_whose_cgroup_counts_no_oom_kill_is_published_at_once(
    runtime: Runtime, tmp_path: Path
) -> None:
    """The kernel counts an OOM kill in the victim's memory cgroup before it signals it: none
    counted, the SIGKILL's exit waits for nothing; one counted, or no cgroup to read (removed
    already, a spec without one), it waits for the OOM event as before."""
    root = tmp_path / "cgroup"
    for cid, kills in (("plain", 0), ("oomed", 1)):
        d = root / "memory" / "kubepods" / "burstable" / f"pod{UID}" / cid
        d.mkdir(parents=True)
        (d / "memory.oom_control").write_text(
            f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
        )
    runtime.labels = {c: pod_labels() for c in ("plain", "oomed", "gone", "unsaid")}
    runtime.cgroups = {c: f"/kubepods/burstable/pod{UID}/{c}" for c in ("plain", "oomed", "gone")}
    stream = connect(runtime.socket, oom_wait=0.5, oom_kills=OomKills(root))
    assert isinstance(stream, ContainerdStream)
    said: list[str] = []
    stream.on_sigkill = lambda cgroup, exit: said.append(cgroup)
    got: list[tuple[str, float]] = []
    started = time.monotonic()

    def run() -> None:
        for e in stream.exits():
            got.append((e.container_id.split("//")[1], time.monotonic() - started))

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    try:
        runtime.send(task_exit("plain", 137))
        wait_for(lambda: len(got) == 1, timeout=0.4, what="the plain SIGKILL, before the wait")
        for cid in ("oomed", "gone", "unsaid"):
            runtime.send(task_exit(cid, 137))
        runtime.send(envelope("TaskOOM", containerd_pb2.TaskOOM(container_id="oomed")))
        wait_for(lambda: len(got) == 4, timeout=10, what="every exit")
    finally:
        stream.close()
        reader.join(5)
    assert said == ["none", "counted", "unread", "unread"]
    assert [cid for cid, _ in got] == ["plain", "oomed", "gone", "unsaid"]
    assert got[0][1] < 0.5 and got[2][1] >= 0.5 and got[3][1] >= 0.5  # the unread: waited


def test_gvisors_128_is_held_for_its_oom_as_a_sigkill_and_read_at_the_pods_cgroup(
    runtime: Runtime, tmp_path: Path
) -> None:
    """gVisor (ADR 0033): a sandbox's processes live in its pod's cgroup, and the host's OOM
    killer takes the whole sandbox, whose containers exit 128 (the shim's status it could not
    read). A runsc container's 128 is read at the pod's cgroup: none counted, published at
    once (a sandbox SIGKILLed on the host); one counted, held for the OOM event. A runc
    container's 128 is its own exit code, published at once without a look."""
    root = tmp_path / "cgroup"
    pods = {"killed": f"pod{UID}", "oomed": "pod-oomed", "runc": "pod-runc"}
    for cid, pod in pods.items():
        d = root / "memory" / "kubepods" / "burstable" / pod
        (d / cid).mkdir(parents=True)
        for where, kills in ((d, 1 if cid == "oomed" else 0), (d / cid, 0)):
            (where / "memory.oom_control").write_text(f"oom_kill_disable 0\noom_kill {kills}\n")
    runtime.labels = {c: pod_labels() for c in pods}
    runtime.cgroups = {c: f"/kubepods/burstable/{pod}/{c}" for c, pod in pods.items()}
    runtime.runtimes = {"killed": RUNSC, "oomed": RUNSC}
    stream = connect(runtime.socket, oom_wait=5.0, oom_kills=OomKills(root))
    assert isinstance(stream, ContainerdStream)
    said: list[str] = []
    stream.on_sigkill = lambda cgroup, exit: said.append(cgroup)
    got: list[Exit] = []

    def run() -> None:
        got.extend(stream.exits())

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    try:
        runtime.send(task_exit("killed", 128))
        runtime.send(task_exit("runc", 128))
        wait_for(lambda: len(got) == 2, timeout=2, what="both published before the wait")
        runtime.send(task_exit("oomed", 128))
        wait_for(lambda: said == ["none", "counted"], timeout=2, what="the OOM kill counted")
        assert len(got) == 2  # held: its pod's cgroup counted an OOM kill
        runtime.send(envelope("TaskOOM", containerd_pb2.TaskOOM(container_id="oomed")))
        wait_for(lambda: len(got) == 3, timeout=2, what="the OOM kill, with its event")
    finally:
        stream.close()
        reader.join(5)
    assert [(e.container_id.split("//")[1], e.exit_code, e.oom) for e in got] == [
        ("killed", 128, False), ("runc", 128, False), ("oomed", 128, True)]  # fmt: skip


def test_the_order_each_oom_came_in_is_told_and_a_late_one_named(runtime: Runtime) -> None:
    """What --oom-wait is chosen from: an OOM before its exit, one after it within the wait,
    and one after the exit was published as no OOM (late: a wrong cause, disputed later)."""
    runtime.labels = {c: pod_labels() for c in ("before", "after", "late", "after-late")}
    stream = connect(runtime.socket, oom_wait=0.2)
    assert isinstance(stream, ContainerdStream)
    heard: list[tuple[str, float]] = []
    stream.on_oom = lambda order, gap: heard.append((order, gap))
    runtime.send(envelope("TaskOOM", containerd_pb2.TaskOOM(container_id="before")))
    runtime.send(task_exit("before", 137))
    runtime.send(task_exit("after", 137))
    runtime.send(envelope("TaskOOM", containerd_pb2.TaskOOM(container_id="after")))
    runtime.send(task_exit("late", 137))
    out: list[Exit] = []
    reader = threading.Thread(target=lambda: out.extend(stream.exits()), daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(out) >= 3, timeout=10, what="three exits")  # "late" once waited
        assert [(e.container_id.split("//")[1], e.oom) for e in out] == [
            ("before", True), ("after", True), ("late", False)]  # fmt: skip
        runtime.send(envelope("TaskOOM", containerd_pb2.TaskOOM(container_id="late")))
        runtime.send(task_exit("after-late", 3))  # read after the OOM: it has been handled
        wait_for(lambda: len(out) >= 4, timeout=10, what="the exit after the late OOM")
    finally:
        stream.close()
        reader.join(5)
    assert [order for order, _ in heard] == ["before_exit", "after_exit", "late"]
    # each from its exit: the late one after the whole wait
    assert all(gap >= 0 for _, gap in heard) and heard[2][1] >= 0.2, heard


@pytest.mark.parametrize("runtime", [("containerd", "v2.4.2")], indirect=True)
def test_the_cri_stream_reports_stops_with_their_status(runtime: Runtime) -> None:
    stream = connect(runtime.socket, oom_wait=0.05, prefer=CRI)
    assert stream.runtime.stream == CRI
    sandbox = cri_pb2.PodSandboxStatus(id="s1", metadata=cri_pb2.PodSandboxMetadata(
        name="sbx-1", uid=UID, namespace="sandboxes"))  # fmt: skip
    finished = int((NOW - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1e9)

    def status(cid: str, state: Any, code: int = 0, reason: str = "") -> Any:
        return cri_pb2.ContainerStatus(id=cid, metadata=cri_pb2.ContainerMetadata(name="agent"),
                                       state=state, exit_code=code, reason=reason,
                                       finished_at=finished)  # fmt: skip

    runtime.send(
        cri_pb2.ContainerEventResponse(
            container_id="c0",
            container_event_type=cri_pb2.CONTAINER_STARTED_EVENT,
            pod_sandbox_status=sandbox,
            containers_statuses=[status("c0", cri_pb2.CONTAINER_RUNNING)],
        )
    )
    runtime.send(cri_pb2.ContainerEventResponse(
        container_id="c1", container_event_type=cri_pb2.CONTAINER_STOPPED_EVENT,
        pod_sandbox_status=sandbox,
        containers_statuses=[status("c1", cri_pb2.CONTAINER_EXITED, 137, "OOMKilled")]))  # fmt: skip
    got = read(stream, 1)
    assert got == [an_exit("c1", 137, oom=True)]


@pytest.mark.parametrize("runtime", [("cri-o", "1.35.0")], indirect=True)
def test_a_cri_stream_that_ends_at_once_says_why(runtime: Runtime) -> None:
    """CRI-O without enable_pod_events answers GetContainerEvents with an empty stream."""
    runtime.send(None)
    stream = connect(runtime.socket, oom_wait=0.05)
    with pytest.raises(RuntimeUnreadable, match="enable_pod_events"):
        list(stream.exits())


def test_no_runtime_on_the_socket_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnreadable) as raised:
        connect(str(tmp_path / "none.sock"), 0.05)
    assert str(raised.value).startswith(str(tmp_path / "none.sock"))
    assert "\n" not in str(raised.value)


def test_the_socket_is_looked_for_where_runtimes_put_it() -> None:
    """ADR 0031: none configured, every known one in order; one configured, that one alone;
    /var/run is /run; each as the host names it and as the container sees it."""
    assert candidates("", "/host") == [(path, "/host" + path) for path in SOCKETS]
    assert candidates("/var/run/crio/crio.sock", "/host/") == [
        ("/run/crio/crio.sock", "/host/run/crio/crio.sock")
    ]
    assert candidates("/run/x/containerd.sock") == [("/run/x/containerd.sock",) * 2]


def test_the_first_socket_that_answers_is_read_and_each_one_tried_is_said(
    runtime: Runtime, tmp_path: Path
) -> None:
    """A missing socket, a socket nobody answers on, then the runtime: the runtime is read. None
    answering: one line naming each socket (as the host names it) and why."""
    silent = tmp_path / "silent.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(silent))  # bound, never listening: connect() is refused
    try:
        tried = [("/run/missing.sock", str(tmp_path / "missing.sock")),
                 ("/run/silent.sock", str(silent))]  # fmt: skip
        stream = connect_any([*tried, ("/run/runtime.sock", str(runtime.socket))], 0.05)
        try:
            assert stream.runtime.name == "containerd"
        finally:
            stream.close()
        with pytest.raises(RuntimeUnreadable) as raised:
            connect_any(tried, 0.05)
    finally:
        listener.close()
    said = str(raised.value)
    assert said.startswith("/run/missing.sock: no such socket; /run/silent.sock: ")
    assert str(tmp_path) not in said and "\n" not in said


def test_a_deaf_observer_says_so_on_its_lease_and_reads_the_runtime_once_it_answers() -> None:
    """A wrong or missing socket (ADR 0031): said on the exits Lease, the metric at 0, tried
    again; once the runtime answers, the Lease names it."""
    api = FakeApi()
    stop = threading.Event()
    answers = threading.Event()
    stream = Scripted([])

    def connector(_socket: str, _wait: float) -> Stream:
        if not answers.is_set():
            raise RuntimeUnreadable("/run/containerd/containerd.sock: no such socket")
        return stream

    metrics = ExitsMetrics()
    observer = ExitListener("/run/containerd/containerd.sock", publisher(api), metrics, Heartbeat(),
                        stop, connector=connector)  # fmt: skip
    runner = threading.Thread(target=observer.run, daemon=True)
    runner.start()

    def source() -> str | None:
        lease = api.get("leases", "deathwatch-system", "rel-exits.node-a")
        return lease["metadata"]["annotations"].get(wire.SOURCE_ANNOTATION) if lease else None

    try:
        said = wait_for(source, timeout=10, what="the Lease written while deaf")
        assert said == "unreadable: /run/containerd/containerd.sock: no such socket"
        assert metrics.connected._value.get() == 0
        assert metrics.reconnects._value.get() >= 1
        answers.set()
        wait_for(lambda: source() == "containerd 2.4.2 (cri)", timeout=30,
                 what="the runtime named once it answers")  # fmt: skip
        assert metrics.connected._value.get() == 1
    finally:
        stop.set()
        runner.join(10)


def test_a_stop_event_without_its_pod_is_not_an_exit() -> None:
    event = cri_pb2.ContainerEventResponse(container_id="c1",
                                           container_event_type=cri_pb2.CONTAINER_STOPPED_EVENT)  # fmt: skip
    assert cri_exit(event, "containerd") is None


# --- the Lease written: once per batch ------------------------------------------------------


def publisher(api: FakeApi, now: Callable[[], datetime] = lambda: NOW) -> Publisher:
    return Publisher(api.agent(), "node-a", "deathwatch-system", "fw-a", "rel-exits", now=now)


def test_the_lease_is_made_then_updated_at_its_version_and_merged_on_a_conflict() -> None:
    api = FakeApi()
    p = publisher(api)
    p.load()
    p.publish([an_exit("c1")], "containerd 1.6.20 (containerd)")
    lease = api.get("leases", "deathwatch-system", "rel-exits.node-a")
    assert lease is not None
    assert lease["metadata"]["labels"]["app.kubernetes.io/component"] == "node-exits"
    notes = lease["metadata"]["annotations"]
    assert notes[wire.NODE_ANNOTATION] == "node-a"
    assert notes[wire.SOURCE_ANNOTATION] == "containerd 1.6.20 (containerd)"
    assert wire.decode(notes[wire.ANNOTATION]) == [an_exit("c1")]
    api.requests.clear()
    p.publish([an_exit("c2", at=NOW + timedelta(seconds=1))])
    assert [m for m, _ in api.requests] == ["PUT"]  # one call: its version carried
    # another writer (the agent's previous pod) wrote meanwhile: read, merged, written
    other = api.get("leases", "deathwatch-system", "rel-exits.node-a")
    assert other is not None
    other["metadata"]["annotations"][wire.ANNOTATION] = wire.encode([an_exit("c0")])
    api.add("leases", "deathwatch-system", other)
    p.publish([an_exit("c3", at=NOW + timedelta(seconds=2))])
    final = api.get("leases", "deathwatch-system", "rel-exits.node-a")
    assert final is not None
    ids = [
        e.container_id[-2:] for e in wire.decode(final["metadata"]["annotations"][wire.ANNOTATION])
    ]
    assert ids == ["c0", "c1", "c2", "c3"]
    assert (
        final["metadata"]["annotations"][wire.SOURCE_ANNOTATION] == "containerd 1.6.20 (containerd)"
    )


class Scripted:
    """A stream of exits a test feeds (the runtime's logic is tested above, over gRPC)."""

    def __init__(self, exits: list[Exit]) -> None:
        from deathwatch.firewall.runtime import Runtime as Said

        self.runtime = Said("containerd", "2.4.2", CRI)
        self.feed = exits
        self.closed = threading.Event()

    def exits(self) -> Iterator[Exit]:
        yield from self.feed
        self.closed.wait()

    def close(self) -> None:
        self.closed.set()


def test_the_observer_writes_a_burst_in_few_writes_and_keeps_a_failed_batch() -> None:
    api = FakeApi()
    stop = threading.Event()
    burst = [an_exit(f"c{i}", at=NOW + timedelta(milliseconds=i)) for i in range(20)]
    stream = Scripted(burst)
    metrics, heartbeat = ExitsMetrics(), Heartbeat()
    observer = ExitListener("unused.sock", publisher(api, lambda: NOW + timedelta(seconds=1)),
                        metrics, heartbeat, stop, connector=lambda _s, _w: stream)  # fmt: skip
    runner = threading.Thread(target=observer.run, daemon=True)
    runner.start()
    try:

        def published() -> list[Exit]:
            lease = api.get("leases", "deathwatch-system", "rel-exits.node-a")
            return wire.decode(lease["metadata"]["annotations"][wire.ANNOTATION]) if lease else []

        assert wait_for(lambda: len(published()) == 20, timeout=10, what="the burst published")
        writes = metrics.writes.labels("ok")._value.get()
        assert writes <= 20  # never more than one write per exit
        assert wait_for(heartbeat.ready, timeout=5, what="ready: connected and written")
        # the API down: the batch is kept, said, and written once the API is back
        api.down = True
        stream.feed.append(an_exit("late", at=NOW + timedelta(milliseconds=500)))
        observer.queue.put(stream.feed[-1])
        wait_for(lambda: metrics.writes.labels("failed")._value.get() >= 1, timeout=5,
                 what="a failed write counted")  # fmt: skip
        wait_for(lambda: not heartbeat.ready(), timeout=5, what="not ready while unwritten")
        api.down = False
        wait_for(lambda: any(e.container_id.endswith("late") for e in published()), timeout=10,
                 what="the kept batch written")  # fmt: skip
    finally:
        stop.set()
        runner.join(10)
    assert stream.closed.is_set()


def test_an_idle_observer_keeps_its_api_connection_open_and_counts_a_failed_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API server closes a connection idle for 90 s: an observer with nothing to write
    uses it before then (ADR 0034), so the next death's write pays no handshake; a failure
    is counted, and the observer goes on."""
    monkeypatch.setattr(exits_module, "WARM_AFTER", 0.0)
    api = FakeApi()
    stop = threading.Event()
    stream = Scripted([])
    metrics = ExitsMetrics()
    observer = ExitListener("unused.sock", publisher(api), metrics, Heartbeat(), stop,
                        connector=lambda _s, _w: stream)  # fmt: skip
    runner = threading.Thread(target=observer.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: metrics.warmups.labels("ok")._value.get() >= 1, timeout=10,
                 what="a warm-up while idle")  # fmt: skip
        assert ("GET", "/version") in api.requests
        api.down = True
        wait_for(lambda: metrics.warmups.labels("failed")._value.get() >= 1, timeout=10,
                 what="a failed warm-up counted")  # fmt: skip
        api.down = False
        before = metrics.warmups.labels("ok")._value.get()
        wait_for(lambda: metrics.warmups.labels("ok")._value.get() > before, timeout=10,
                 what="warm-ups again once the API answers")  # fmt: skip
    finally:
        stop.set()
        runner.join(10)


def test_the_generated_protos_are_what_the_pinned_generator_makes(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "hack" / "gen_protos.sh"), str(tmp_path)], check=True,
                   timeout=120)  # fmt: skip
    here = ROOT / "firewall" / "src" / "deathwatch" / "firewall" / "protos"
    for name in ("cri_pb2.py", "cri_pb2.pyi", "containerd_pb2.py", "containerd_pb2.pyi"):
        assert (tmp_path / name).read_text() == (here / name).read_text(), name
