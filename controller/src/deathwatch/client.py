"""Act on verdicts: read, watch and wait for SandboxVerdicts. Public and kept stable, like
`deathwatch.policy`.

    from deathwatch.client import Client, State

    async with Client.from_kubeconfig() as dw:
        verdict = await dw.get("team-a", "sandbox-7")          # None if there is none
        async for change in dw.watch("team-a"):                # every transition, once
            if change.verdict.state is State.DEAD:
                reclaim(change.verdict.pod, change.verdict.cause)
        verdict = await dw.wait_for("team-a", "sandbox-7", {State.DEAD, State.GONE}, 60)

    # scripts: the same, blocking
    from deathwatch.client import get_verdict, wait_for_verdict

A SandboxVerdict is named after its pod, in the pod's namespace. `watch` lists first (one
`Change` per verdict, its current state), then follows a watch from that list's
resourceVersion; a dropped connection resumes from the last version seen, and a version the
API server no longer has (410 Gone) lists again and hands over only what changed meanwhile:
a caller never gets the same transition (pod uid, state) twice, and a verdict deleted while
it was not looking arrives as one `Change` with `deleted=True`. Every request has a deadline
(30 s); a watch with no byte for 70 s (the API server sends a bookmark every minute) is
treated as dropped.

Dead and Gone are final for a pod: a Dead verdict is never taken back (the CRD refuses it),
and a Gone pod cannot die. `wait_for` raises `NeverReached` as soon as the verdict is final
and not one of the states asked for, and `TimeoutError` at the deadline.

A platform that receives verdicts as CloudEvents (`--delivery-config`; docs/delivery.md, "Delivering
verdicts") decodes each event's `data` with `verdict_document`: the same `VerdictDocument`
that `deathwatch explain -o json` prints.

An agent-sandbox Sandbox outlives its pods (suspended, its pod is deleted; resumed, a new pod
has a verdict of its own): `of_sandbox` and `wait_for_sandbox` follow the verdict of its
current pod, found by the `deathwatch.dev/sandbox` label.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Final, TypeVar

import msgspec
import structlog

from deathwatch._api.kubeconfig import CredentialError, KubeconfigError, Loaded
from deathwatch._api.kubeconfig import load as load_kubeconfig
from deathwatch._api.resources import (
    GROUP,
    SANDBOX_LABEL,
    SV_PLURAL,
    VERSION,
    Condition,
    ConditionType,
    DisruptionStatus,
    SandboxVerdictStatus,
)
from deathwatch._api.rest import Rest
from deathwatch._api.verdict_document import VerdictDocument
from deathwatch._engine.verdict import Cause, Origin, State
from deathwatch._kube import backoff
from deathwatch._kube.errors import ApiError, NoAnswer, describe
from deathwatch._kube.listwatch import LISTED, Item, Listed, Listing, ListWatch, outputs

__all__ = [
    "FINAL",
    "ApiError",
    "Cause",
    "Change",
    "Client",
    "Condition",
    "CredentialError",
    "DisruptionStatus",
    "KubeconfigError",
    "NeverReached",
    "NoAnswer",
    "Origin",
    "State",
    "Unreachable",
    "Verdict",
    "VerdictDocument",
    "current",
    "get_verdict",
    "verdict_document",
    "wait_for_verdict",
]

FINAL: Final = frozenset({State.DEAD, State.GONE})  # a pod's verdict never leaves these
WATCH_INACTIVITY = 70.0  # seconds: above the API server's bookmark interval (about 60 s)
log = structlog.get_logger("deathwatch.client")
T = TypeVar("T")


class NeverReached(Exception):
    """The verdict is final and not what was waited for (a Gone pod can never be Dead).
    Called `Unreachable` before 0.x (an alias is kept, and means only this); a call that got
    no answer from the API server is `NoAnswer`, a different thing."""

    def __init__(self, verdict: Verdict, wanted: Collection[State]) -> None:
        want = "|".join(sorted(s.value for s in wanted))
        super().__init__(
            f"{verdict.namespace}/{verdict.pod} is {verdict.state.value}"
            f"{f' ({verdict.cause.value})' if verdict.cause else ''}: it can never be {want}"
        )
        self.verdict = verdict


Unreachable = NeverReached  # deprecated: the name it had (CHANGELOG)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One SandboxVerdict: the pod it judges and its typed status."""

    namespace: str
    pod: str  # the SandboxVerdict's name
    resource_version: str
    deathwatch: str | None
    state: State  # Pending until the controller has written a status
    status: SandboxVerdictStatus | None  # None: created, no status written yet
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def cause(self) -> Cause | None:
        return self.status.cause if self.status else None

    @property
    def origin(self) -> Origin | None:
        """On Dead and Gone: whose doing the end was (Workload, Infrastructure, Platform,
        Unknown). A platform bills Workload deaths and may restart Infrastructure ones."""
        return self.status.origin if self.status else None

    @property
    def disruption(self) -> DisruptionStatus | None:
        """The DisruptionTarget condition behind the verdict: the component's reason and
        message (a drain, a preemption, a taint eviction, pod GC, the kubelet)."""
        return self.status.disruption if self.status else None

    @property
    def pod_uid(self) -> str | None:
        return self.status.pod_uid if self.status else None

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def condition(self, kind: str) -> Condition | None:
        conditions = self.status.conditions if self.status else []
        return next((c for c in conditions if c.type == kind), None)

    @property
    def shielded(self) -> Condition | None:
        return self.condition(ConditionType.SHIELDED)

    @property
    def declared_at(self) -> datetime | None:
        return self.status.declared_at if self.status else None


def verdict_document(data: bytes | str | Mapping[str, Any]) -> VerdictDocument:
    """A delivered event's `data` (structured mode: the event's `data`; binary mode: the
    body), typed. Raises ValueError naming the field that is wrong."""
    try:
        if isinstance(data, bytes | str):
            return msgspec.json.decode(data, type=VerdictDocument)
        return msgspec.convert(data, VerdictDocument)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"not a verdict document: {exc}") from None


@dataclass(frozen=True, slots=True)
class Change:
    """A transition handed over once: the verdict as it is now, and the state it had when
    this client last handed it over (None: the first time, or a new pod of the same name)."""

    verdict: Verdict
    previous: State | None
    deleted: bool = False


class _Meta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = ""
    resource_version: str = ""
    labels: dict[str, str] = {}


class _Spec(msgspec.Struct, rename="camel"):
    death_watch: str | None = None


class _Object(msgspec.Struct):
    metadata: _Meta
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: SandboxVerdictStatus | None = None


_decode_object = msgspec.json.Decoder(_Object).decode


def _verdict(o: _Object) -> Verdict:
    m = o.metadata
    state = o.status.state if o.status else State.PENDING
    return Verdict(
        m.namespace, m.name, m.resource_version, o.spec.death_watch, state, o.status, m.labels
    )


def _path(namespace: str | None, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{VERSION}"
    scope = f"{base}/namespaces/{namespace}/{SV_PLURAL}" if namespace else f"{base}/{SV_PLURAL}"
    return f"{scope}/{name}" if name else scope


class Client:
    """SandboxVerdicts, read-only, over one HTTPS connection pool. Use `async with`."""

    def __init__(self, rest: Rest) -> None:
        self._rest = rest
        self.relists = 0  # watches that could not resume (410) and listed again
        self.reconnects = 0  # watches resumed after a dropped connection

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None, context: str | None = None) -> Client:
        """--kubeconfig if given, else in a pod its ServiceAccount, else $KUBECONFIG or
        ~/.kube/config. Raises `KubeconfigError` or `CredentialError` (one line each, naming
        the file, context and field)."""
        return cls.from_loaded(load_kubeconfig(kubeconfig, context))

    @classmethod
    def from_loaded(cls, loaded: Loaded) -> Client:
        return cls(Rest(loaded.configuration, identity="client", purpose="verdicts", connections=2))

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._rest.close()

    async def get(self, namespace: str, pod: str) -> Verdict | None:
        """The verdict of `pod` in `namespace`, or None if it has none (yet). Where the API
        server does not serve SandboxVerdicts at all (deathwatch's CRDs not installed), the
        404 is raised: `ApiError.missing_resource`."""
        try:
            body = await self._rest.request("GET", _path(namespace, pod))
        except ApiError as e:
            if e.not_found and not e.missing_resource:
                return None
            raise
        return _verdict(_decode_object(body))

    async def pod_exists(self, namespace: str, pod: str) -> bool | None:
        """Whether the pod is there; None when the caller may not read pods (a tenant's
        read-only role need not grant it)."""
        try:
            await self._rest.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
        except ApiError as e:
            if e.not_found:
                return False
            if e.forbidden:
                return None
            raise
        return True

    async def verdicts(
        self, namespace: str | None = None, label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Verdict], str]:  # fmt: skip
        """Every verdict (in `namespace`, or all the caller may list), and the list's
        resourceVersion: one complete listing, in pages (listed again from the start if a
        page's continue token expires); any other failure is the caller's.
        `field_selector`: the API server selects by `status.state`, `status.cause` and
        `status.origin` (the CRD's selectableFields), e.g. "status.origin=Infrastructure"."""
        protocol = ListWatch(label_selector=label_selector, field_selector=field_selector,
                             follow=False, fatal=lambda _: True)  # fmt: skip
        transport = self._rest.transport(_path(namespace), WATCH_INACTIVITY)
        verdicts: list[Verdict] = []
        version = ""
        async for out in outputs(protocol, transport):
            if isinstance(out, Listing):
                verdicts = []
            elif isinstance(out, Item):
                verdicts.append(_verdict(_decode_object(out.raw)))
            elif isinstance(out, Listed):
                version = out.version
        return verdicts, version

    async def events(self, namespace: str, pod: str) -> list[dict[str, Any]]:
        """The Events that name `pod` (the kubelet's, and deathwatch's on the pod and on its
        verdict), as the API returns them."""
        params = {"fieldSelector": f"involvedObject.name={pod}"}
        body = await self._rest.request("GET", f"/api/v1/namespaces/{namespace}/events",
                                        params=params)  # fmt: skip
        items: list[dict[str, Any]] = msgspec.json.decode(body).get("items") or []
        return items

    async def watch(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> AsyncIterator[Change]:
        """Every transition of every verdict (in `namespace`), each once; runs until the
        caller stops iterating. Reconnects on its own (with backoff); an error that is not a
        dropped connection (403, 404: no CRD) is raised."""
        seen: dict[tuple[str, str], tuple[str | None, State]] = {}  # (ns, pod) -> (uid, state)
        protocol = ListWatch(
            label_selector=label_selector, field_selector=field_selector, server_timeout=300,
            backoff=backoff.RECONNECT, fatal=_refused,
        )  # fmt: skip
        transport = self._rest.transport(_path(namespace), WATCH_INACTIVITY)
        listed: list[Verdict] = []
        async for out in outputs(protocol, transport):
            if isinstance(out, Item):
                verdict = _verdict(_decode_object(out.raw))
                if out.type == LISTED:
                    listed.append(verdict)
                    continue
                moved = _transition(seen, verdict, deleted=out.type == "DELETED")
                if moved is not None:
                    yield moved
            elif isinstance(out, Listing):
                listed = []
            elif isinstance(out, Listed):
                for change in _resync(seen, listed):
                    yield change
                listed = []
            elif out.what == "expired":
                self.relists += 1  # the version is compacted away, or the cache restarted
                log.info("a verdict watch could not resume (410 Gone): listing again")
            elif out.what == "failed" and out.error is not None:
                self.reconnects += 1
                log.info("verdict watch dropped, resuming", error=describe(out.error),
                         retry_in=out.retry_in)  # fmt: skip

    async def wait_for(
        self,
        namespace: str,
        pod: str,
        states: Collection[State],
        timeout: float,  # noqa: ASYNC109 - the deadline of the whole wait, the caller's word
    ) -> Verdict:
        """The verdict once its state is one of `states`. Raises `NeverReached` when it is
        final and not one of them, `TimeoutError` after `timeout` seconds."""
        wanted = frozenset(states)

        async def reached() -> Verdict:
            async for change in self.watch(namespace, field_selector=f"metadata.name={pod}"):
                v = change.verdict
                if change.deleted:
                    continue  # its retention ended; a new pod of that name may come
                if v.state in wanted:
                    return v
                if v.final:
                    raise NeverReached(v, wanted)
            raise AssertionError("a watch does not end")  # pragma: no cover

        return await asyncio.wait_for(reached(), timeout)

    async def of_sandbox(self, namespace: str, sandbox: str) -> Verdict | None:
        """The verdict of an agent-sandbox Sandbox's current pod, or None if it has none."""
        verdicts, _ = await self.verdicts(namespace, f"{SANDBOX_LABEL}={sandbox}")
        return current(verdicts)

    async def wait_for_sandbox(
        self,
        namespace: str,
        sandbox: str,
        states: Collection[State],
        timeout: float,  # noqa: ASYNC109 - the deadline of the whole wait, the caller's word
    ) -> Verdict:
        """The verdict of the Sandbox's current pod once its state is one of `states`.
        Raises `NeverReached` when no pod of it can ever be in them: a pod that is Dead (its
        Sandbox leaves a failed pod in place) or Gone because the Sandbox expired; a
        suspended or re-created Sandbox's next pod is waited for."""
        wanted = frozenset(states)

        async def reached() -> Verdict:
            latest: dict[str, Verdict] = {}
            async for change in self.watch(namespace, label_selector=f"{SANDBOX_LABEL}={sandbox}"):
                v = change.verdict
                if change.deleted:
                    latest.pop(v.pod, None)
                    continue
                latest[v.pod] = v
                now = current(latest.values())
                if now is None or now.pod != v.pod:
                    continue  # an older pod's verdict changed: not the Sandbox's current one
                if v.state in wanted:
                    return v
                if v.state is State.DEAD or (v.state is State.GONE and v.cause in _SANDBOX_ENDS):
                    raise NeverReached(v, wanted)
            raise AssertionError("a watch does not end")  # pragma: no cover

        return await asyncio.wait_for(reached(), timeout)


def current(verdicts: Iterable[Verdict]) -> Verdict | None:
    """Of a Sandbox's verdicts (one per pod it had), its current pod's: a live one, else the
    latest declared."""
    ordered = sorted(verdicts, key=lambda v: (not v.final, v.declared_at or datetime.min.replace(
        tzinfo=UTC)))  # fmt: skip
    return ordered[-1] if ordered else None


# the causes after which a Sandbox never has a pod again: waiting on is pointless
_SANDBOX_ENDS = frozenset({Cause.EXPIRED})


def _refused(exc: BaseException) -> bool:
    """An error that ends a watch: the API's refusal for good (403, 404: no CRD), not a
    throttle or a server error (both pass)."""
    return isinstance(exc, ApiError) and not (exc.throttled or exc.server_error)


def _transition(
    seen: dict[tuple[str, str], tuple[str | None, State]], v: Verdict, deleted: bool = False
) -> Change | None:
    key = (v.namespace, v.pod)
    last = seen.get(key)
    if deleted:
        seen.pop(key, None)
        return Change(v, last[1] if last else None, deleted=True) if last else None
    now = (v.pod_uid, v.state)
    if last == now:
        return None
    seen[key] = now
    same_pod = last is not None and last[0] == v.pod_uid
    return Change(v, last[1] if same_pod and last else None)


def _resync(
    seen: dict[tuple[str, str], tuple[str | None, State]], verdicts: Iterable[Verdict]
) -> list[Change]:
    """After a (re)list: what changed since the caller last heard, and what vanished."""
    present = {(v.namespace, v.pod): v for v in verdicts}
    changes = [c for v in present.values() if (c := _transition(seen, v)) is not None]
    for key in [k for k in seen if k not in present]:
        _, state = seen.pop(key)
        namespace, pod = key
        gone = Verdict(namespace, pod, "", None, state, None)
        changes.append(Change(gone, state, deleted=True))
    return changes


def _run(kubeconfig: str | None, job: Callable[[Client], Awaitable[T]]) -> T:
    async def main() -> T:
        async with Client.from_kubeconfig(kubeconfig) as c:
            return await job(c)

    return asyncio.run(main())


def get_verdict(namespace: str, pod: str, *, kubeconfig: str | None = None) -> Verdict | None:
    """`Client.get`, blocking."""
    return _run(kubeconfig, lambda c: c.get(namespace, pod))


def wait_for_verdict(
    namespace: str,
    pod: str,
    states: Collection[State | str],
    timeout: float,
    *,
    kubeconfig: str | None = None,
) -> Verdict:
    """`Client.wait_for`, blocking; states as `State` or their names ("Dead")."""
    wanted = frozenset(State(s) for s in states)
    return _run(kubeconfig, lambda c: c.wait_for(namespace, pod, wanted, timeout))
