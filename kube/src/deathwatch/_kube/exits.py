"""Container exits heard on a node, as the node agent publishes them and the controller reads
them: one Lease per node (`PREFIX.NODE`, label `app.kubernetes.io/component: node-exits`),
its annotation `deathwatch.dev/exits` the node's recent exits as compact JSON (ADR 0028).

The Lease is the hop: the agent writes it once per batch of exits (at most one write per
death), the controller's shard leaders watch it, and the chart's admission policy lets each
node's agent write only its own. Pure: the format, its bounds and its reading, shared by both
sides, so neither can drift from the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Annotated, Any, Final

import msgspec

ANNOTATION: Final = "deathwatch.dev/exits"
NODE_ANNOTATION: Final = "deathwatch.dev/node"
# where its exits come from: the runtime and the stream (cri: CRI GetContainerEvents;
# containerd: containerd's own task events), as the agent last connected
SOURCE_ANNOTATION: Final = "deathwatch.dev/exits-source"
COMPONENT: Final = "node-exits"
LABEL_SELECTOR: Final = f"app.kubernetes.io/component={COMPONENT}"
LEASE_PREFIX: Final = "deathwatch-exits"
KEPT_EXITS: Final = 64  # the most recent exits a Lease holds: a burst larger than this is judged
# by the kubelet's reports, as ever (nothing is lost, only heard later)
MAX_AGE: Final = timedelta(minutes=5)  # older exits leave the Lease at its next write
_ID: Final = 512


class Exit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    """One container's exit, named as the pod's status names it."""

    container_id: Annotated[str, msgspec.Meta(max_length=_ID)] = msgspec.field(name="id")
    pod_uid: Annotated[str, msgspec.Meta(max_length=64)] = msgspec.field(name="uid")
    namespace: Annotated[str, msgspec.Meta(max_length=63)] = msgspec.field(name="ns")
    pod: Annotated[str, msgspec.Meta(max_length=253)]
    container: Annotated[str, msgspec.Meta(max_length=63)]
    exit_code: int = msgspec.field(name="code")
    oom: bool = False
    exited_at: datetime = msgspec.field(name="at")


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(list[Exit])


class MalformedExits(ValueError):
    """The annotation is not a list of exits: one line naming the problem."""


def encode(exits: Iterable[Exit]) -> str:
    return _ENCODER.encode(list(exits)).decode()


def decode(text: str) -> list[Exit]:
    """The exits an annotation holds. Raises MalformedExits (one line) on anything else."""
    try:
        return _DECODER.decode(text)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise MalformedExits(f"{ANNOTATION}: {exc}") from None


def kept(exits: Iterable[Exit], now: datetime) -> list[Exit]:
    """What a Lease holds: the exits of the last MAX_AGE, oldest first, at most KEPT_EXITS, one per
    container instance."""
    fresh: dict[str, Exit] = {}
    for e in exits:
        if now - e.exited_at <= MAX_AGE:
            fresh[e.container_id] = e
    ordered = sorted(fresh.values(), key=lambda e: e.exited_at)
    return ordered[-KEPT_EXITS:]


def lease_name(node: str, prefix: str = LEASE_PREFIX) -> str:
    """PREFIX.NODE, hashed where that would pass the 253 characters a name may have."""
    name = f"{prefix}.{node}"
    if len(name) > 253:
        name = f"{prefix}.{hashlib.sha256(node.encode()).hexdigest()[:32]}"
    return name


def read_lease(lease: Mapping[str, Any]) -> tuple[str, list[Exit]] | None:
    """A node's exits Lease as the API shows it: its node and its exits (None: not one)."""
    meta = lease.get("metadata") or {}
    notes = meta.get("annotations") or {}
    node = notes.get(NODE_ANNOTATION)
    if not isinstance(node, str) or not node:
        return None
    text = notes.get(ANNOTATION)
    if not isinstance(text, str) or not text:
        return node, []
    return node, decode(text)
