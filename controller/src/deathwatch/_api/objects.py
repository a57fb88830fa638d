"""The objects of deathwatch's watches, each decoded once from its bytes into just what the
controller reads (msgspec, in C, only the fields declared), and what a watch says of them:

- SandboxVerdicts into `VerdictObject` (name, version, DeathWatch, labels, status);
- DeathWatches into `DeathWatchObject` (who and which revision, its status still in bytes,
  the whole object decoded only when its spec is a new revision);
- pods straight into the engine's `PodView`, agent-sandbox's Sandboxes into `SandboxObject`;
- the kubelet's Evicted Events into `EvictionNotice` (the pod's uid and the kubelet's message);
- `EventType`: what a watch (or a listing) says happened to one; `Undecodable`: an object a
  decoder refuses, named as far as it could be read.

Pure: the collections that carry them are the controller's (its sources)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

import msgspec

from deathwatch._api import agent_sandbox
from deathwatch._api.agent_sandbox import SandboxObject
from deathwatch._api.resources import CONTROLLER_ID_ANNOTATION, DeathWatchKey
from deathwatch._engine.podview import MalformedPod, PodView, decode_pod


class EventType(Enum):
    """What a watch (or a listing) says happened to an object."""

    LISTED = "LISTED"  # in a listing: exists now (it may or may not be new)
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


class Undecodable(ValueError):
    """An object the collection's decoder refuses; `who` names it as far as it could be read."""

    def __init__(self, who: str, problem: str) -> None:
        super().__init__(f"{who}: {problem}")
        self.who = who
        self.problem = problem


class VerdictObject:
    """A SandboxVerdict as its watch shows it: just what the controller reads."""

    __slots__ = ("deathwatch", "labels", "name", "namespace", "status", "version")

    def __init__(self, namespace: str, name: str, version: str, deathwatch: str,
                 labels: Mapping[str, str], status: dict[str, Any] | None) -> None:  # fmt: skip
        self.namespace, self.name, self.version = namespace, name, version
        self.deathwatch, self.labels, self.status = deathwatch, labels, status


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


def who(raw: msgspec.Raw) -> str:
    """An object's name as far as it can be read, for a log line about it."""
    try:
        meta = _named(raw).metadata
    except (msgspec.ValidationError, msgspec.DecodeError):
        return "an object without a readable name"
    return f"{meta.namespace}/{meta.name} ({meta.uid})"


def decode_pod_view(raw: msgspec.Raw) -> PodView:
    try:
        return decode_pod(raw)[0]
    except MalformedPod as exc:
        raise Undecodable(who(raw), str(exc)) from None


def decode_verdict(raw: msgspec.Raw) -> VerdictObject:
    try:
        v = _verdict(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Undecodable(who(raw), str(exc)) from None
    m = v.metadata
    return VerdictObject(m.namespace, m.name, m.resource_version, v.spec.death_watch, m.labels,
                   v.status)  # fmt: skip


def decode_deathwatch(raw: msgspec.Raw | bytes) -> DeathWatchObject:
    """A DeathWatch from its JSON bytes. Raises Undecodable naming what it could read."""
    raw = raw if isinstance(raw, msgspec.Raw) else msgspec.Raw(raw)
    try:
        dw = _deathwatch(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Undecodable(who(raw), str(exc)) from None
    m = dw.metadata
    controller = (m.annotations or {}).get(CONTROLLER_ID_ANNOTATION, "")
    return DeathWatchObject(m.namespace, m.name, m.uid, m.generation, m.resource_version,
                            m.deletion_timestamp is not None, dw.status, raw,
                            controller)  # fmt: skip


class _Involved(msgspec.Struct, rename="camel"):
    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""


class _Source(msgspec.Struct):
    component: str = ""


class _Event(msgspec.Struct, rename="camel"):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    involved_object: _Involved = msgspec.field(default_factory=_Involved)
    reason: str = ""
    message: str = ""
    source: _Source = msgspec.field(default_factory=_Source)
    reporting_component: str = ""


class EvictionNotice(msgspec.Struct, frozen=True, gc=False):
    """The kubelet's Evicted Event of a pod (core/v1): which pod, and the kubelet's message
    ("Pod ephemeral local storage usage exceeds ...", "The node was low on resource: ...").
    `from_kubelet`: the kubelet's, of a Pod, reason Evicted (another component may use the
    reason; the field selector says the reason, the source is checked here)."""

    pod_uid: str
    namespace: str
    name: str
    message: str
    from_kubelet: bool


KUBELET = "kubelet"
_event = msgspec.json.Decoder(_Event).decode


def decode_eviction(raw: msgspec.Raw) -> EvictionNotice:
    try:
        e = _event(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise Undecodable(who(raw), str(exc)) from None
    o = e.involved_object
    kubelet = KUBELET in (e.source.component, e.reporting_component)
    return EvictionNotice(o.uid, o.namespace, o.name, e.message,
                          kubelet and o.kind == "Pod" and e.reason == "Evicted")  # fmt: skip


def decode_sandbox(raw: msgspec.Raw) -> SandboxObject:
    try:
        return agent_sandbox.read(raw)[0]
    except ValueError as exc:
        raise Undecodable(who(raw), str(exc)) from None
