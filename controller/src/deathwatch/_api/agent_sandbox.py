"""agent-sandbox's API as deathwatch reads it (agents.x-k8s.io/v1beta1): the group, and a
Sandbox decoded from its bytes into just what a verdict needs (`SandboxObject`). The label
its controller puts on every pod of a Sandbox is part of what a DeathWatch selects
(deathwatch._kube.selection). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import msgspec

from deathwatch._kube.selection import SANDBOX_GROUP

GROUP = SANDBOX_GROUP
VERSION = "v1beta1"
PLURAL = "sandboxes"
TEMPLATE_ANNOTATION = "agents.x-k8s.io/sandbox-template-ref"
SUSPENDED = "Suspended"  # spec.operatingMode


class _Owner(msgspec.Struct, rename="camel"):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    controller: bool = False


class _Meta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    deletion_timestamp: datetime | None = None
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    owner_references: list[_Owner] = msgspec.field(default_factory=list)


class _Spec(msgspec.Struct, rename="camel"):
    operating_mode: str = "Running"
    shutdown_time: datetime | None = None


class _Sandbox(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


_decode = msgspec.json.Decoder(_Sandbox).decode


@dataclass(frozen=True, slots=True)
class SandboxObject:
    """A Sandbox as a verdict needs it."""

    namespace: str
    name: str
    uid: str
    claim: str | None
    warm_pool: str | None
    template: str | None
    suspended: bool
    shutdown_time: datetime | None
    deleting: bool


def read(raw: bytes | msgspec.Raw) -> tuple[SandboxObject, str]:
    """A Sandbox from its JSON bytes, and its resourceVersion. Raises ValueError naming the
    problem (msgspec names the field)."""
    try:
        s = _decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(str(exc)) from None
    m = s.metadata
    if not m.name or not m.uid:
        raise ValueError("metadata.name and metadata.uid: a Sandbox needs both")
    claim = pool = None
    for ref in m.owner_references:
        if ref.controller and ref.api_version.split("/")[0] == f"extensions.{GROUP}":
            if ref.kind == "SandboxClaim":
                claim = ref.name or None
            elif ref.kind == "SandboxWarmPool":
                pool = ref.name or None
    obj = SandboxObject(
        namespace=m.namespace or "default",
        name=m.name,
        uid=m.uid,
        claim=claim,
        warm_pool=pool,
        template=m.annotations.get(TEMPLATE_ANNOTATION) or None,
        suspended=s.spec.operating_mode == SUSPENDED,
        shutdown_time=s.spec.shutdown_time,
        deleting=m.deletion_timestamp is not None,
    )
    return obj, m.resource_version
