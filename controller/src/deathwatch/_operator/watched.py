"""The collections the controller reads through its own reflector (reflector.py), and how
each of their objects is decoded, once, from its bytes:

- pods, straight into the engine's `PodView` (msgspec, only the fields a verdict needs);
- SandboxVerdicts, into `Verdict` (name, version, owner, status): listed at start they rebuild
  the engine's memory, watched they keep a standby level with the leader;
- agent-sandbox's Sandboxes, into `SandboxObject` (agent_sandboxes.py), when installed;
- DeathWatches, into `DeathWatchObject`: their metadata read, their status kept as bytes and
  the whole object decoded only when its spec is a new revision. Most of their events are
  the controller's own status writes (each shard's part, shard 0's totals: about one a
  second per shard), which every process receives: through kopf's handler each one cost a
  whole decode and a handler call, about as much as a death (#43).
"""

from __future__ import annotations

from typing import Any

import msgspec

from deathwatch._engine.podview import MalformedPod, PodView, decode_pod
from deathwatch._operator import agent_sandboxes
from deathwatch._operator.agent_sandboxes import SandboxObject
from deathwatch._operator.kube import objects
from deathwatch._operator.reflector import Collection, Undecodable
from deathwatch._operator.resources import (
    CONTROLLER_ID_ANNOTATION,
    DW_PLURAL,
    SV_PLURAL,
    DeathWatchKey,
)
from deathwatch._operator.verdict_watch import Verdict


class _Meta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class _VerdictSpec(msgspec.Struct, rename="camel"):
    death_watch: str = ""


class _Verdict(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _VerdictSpec = msgspec.field(default_factory=_VerdictSpec)
    status: dict[str, Any] | None = None


_NULL = msgspec.Raw(b"null")


class _DeathWatchMeta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    generation: int | None = None
    resource_version: str = ""
    deletion_timestamp: str | None = None
    annotations: dict[str, str] | None = None


class _DeathWatch(msgspec.Struct):
    metadata: _DeathWatchMeta = msgspec.field(default_factory=_DeathWatchMeta)
    status: msgspec.Raw = msgspec.field(default_factory=lambda: _NULL)  # Raw | None: refused


class DeathWatchObject(msgspec.Struct, frozen=True):
    """A DeathWatch as its watch shows it: who and which revision it is, its status still in
    bytes, and the whole object in bytes for when its spec must be compiled."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    version: str  # its resourceVersion
    deleting: bool  # a deletionTimestamp is set
    status: msgspec.Raw  # JSON: null when it has none yet
    raw: msgspec.Raw
    # which controller serves it: its deathwatch.dev/controller-id annotation ("": the
    # controller started without --controller-id)
    controller: str = ""

    @property
    def key(self) -> DeathWatchKey:
        return (self.namespace or "default", self.name)

    def body(self) -> dict[str, Any]:
        """The whole object, decoded from its bytes: only its metadata was decoded before,
        so a spec revision not compiled yet is the one event that pays for this."""
        body: dict[str, Any] = msgspec.json.decode(self.raw)
        return body


class _Named(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_verdict = msgspec.json.Decoder(_Verdict).decode
_deathwatch = msgspec.json.Decoder(_DeathWatch).decode
_named = msgspec.json.Decoder(_Named, strict=False).decode


def _who(raw: msgspec.Raw) -> str:
    """An object's name as far as it can be read, for a log line about it."""
    try:
        meta = _named(raw).metadata
    except (msgspec.ValidationError, msgspec.DecodeError):
        return "an object without a readable name"
    return f"{meta.namespace}/{meta.name} ({meta.uid})"


def _decode_pod(raw: msgspec.Raw) -> PodView:
    try:
        return decode_pod(raw)[0]
    except MalformedPod as exc:
        raise Undecodable(_who(raw), str(exc)) from None


def _decode_verdict(raw: msgspec.Raw) -> Verdict:
    try:
        v = _verdict(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Undecodable(_who(raw), str(exc)) from None
    m = v.metadata
    return Verdict(m.namespace, m.name, m.resource_version, v.spec.death_watch, m.labels,
                   v.status)  # fmt: skip


def pods(namespace: str | None, label_selector: str | None = None,
         shard_selector: str | None = None) -> Collection[PodView]:  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    return Collection("pods", path, _decode_pod, namespace, label_selector, shard_selector)


def verdicts(namespace: str | None, label_selector: str | None = None) -> Collection[Verdict]:
    """`label_selector`: a shard's verdicts (`deathwatch.dev/slot in (...)`), and those from
    before sharding, which carry no slot yet (`!deathwatch.dev/slot`), as a second collection."""
    return Collection(SV_PLURAL, objects(SV_PLURAL, namespace), _decode_verdict, namespace,
                      label_selector)  # fmt: skip


def decode_deathwatch(raw: msgspec.Raw | bytes) -> DeathWatchObject:
    """A DeathWatch from its JSON bytes. Raises Undecodable naming what it could read."""
    raw = raw if isinstance(raw, msgspec.Raw) else msgspec.Raw(raw)
    try:
        dw = _deathwatch(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Undecodable(_who(raw), str(exc)) from None
    m = dw.metadata
    controller = (m.annotations or {}).get(CONTROLLER_ID_ANNOTATION, "")
    return DeathWatchObject(m.namespace, m.name, m.uid, m.generation, m.resource_version,
                            m.deletion_timestamp is not None, dw.status, raw,
                            controller)  # fmt: skip


def deathwatches(namespace: str | None) -> Collection[DeathWatchObject]:
    return Collection(DW_PLURAL, objects(DW_PLURAL, namespace), decode_deathwatch, namespace)


def _decode_sandbox(raw: msgspec.Raw) -> SandboxObject:
    try:
        return agent_sandboxes.read(raw)[0]
    except ValueError as exc:
        raise Undecodable(_who(raw), str(exc)) from None


def sandboxes(namespace: str | None) -> Collection[SandboxObject]:
    """agent-sandbox's Sandboxes: optional (its CRDs may come later, or never)."""
    base = f"/apis/{agent_sandboxes.GROUP}/{agent_sandboxes.VERSION}"
    path = f"{base}/namespaces/{namespace}/{agent_sandboxes.PLURAL}" if namespace else (
        f"{base}/{agent_sandboxes.PLURAL}"
    )  # fmt: skip
    return Collection(agent_sandboxes.PLURAL, path, _decode_sandbox, namespace, optional=True)
