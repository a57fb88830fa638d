"""The collections the controller reads through its own reflector (reflector.py), and how
each of their objects is decoded, once, from its bytes:

- pods, straight into the engine's `PodView` (msgspec, only the fields a verdict needs);
- SandboxVerdicts, into `Verdict` (name, version, owner, status): listed at start they rebuild
  the engine's memory, watched they keep a standby level with the leader;
- agent-sandbox's Sandboxes, into `SandboxObject` (agent_sandboxes.py), when installed.

DeathWatches, a handful of objects that change when people edit them, stay kopf's
(app.py): its handler semantics are worth more there than a stream of our own.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deathwatch._engine.podview import MalformedPod, PodView, decode_pod
from deathwatch._operator import agent_sandboxes
from deathwatch._operator.agent_sandboxes import SandboxObject
from deathwatch._operator.kube import objects
from deathwatch._operator.reflector import Collection, Undecodable
from deathwatch._operator.resources import SV_PLURAL
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


class _Named(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_verdict = msgspec.json.Decoder(_Verdict).decode
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
