"""The collections the controller reads through its own reflector (reflector.py), and how
each of their objects is decoded, once, from its bytes:

- pods, straight into the engine's `PodView` (msgspec, only the fields a verdict needs);
- SandboxVerdicts, into `VerdictObject` (name, version, owner, status): listed at start they rebuild
  the engine's memory, watched they keep a standby level with the leader;
- agent-sandbox's Sandboxes, into `SandboxObject` (agent_sandboxes.py), when installed;
- the kubelet's Evicted Events (reason=Evicted, filtered by the API server), into
  `EvictionNotice`: the word of an eviction the pod's own status withholds until its
  containers have stopped (ADR 0044);
- DeathWatches, into `DeathWatchObject`: their metadata read, their status kept as bytes and
  the whole object decoded only when its spec is a new revision. Most of their events are
  the controller's own status writes (each shard's part, shard 0's totals: about one a
  second per shard), which every process receives: through kopf's handler each one cost a
  whole decode and a handler call, about as much as a death (#43).
"""

from __future__ import annotations

from dataclasses import dataclass

from deathwatch._api import agent_sandbox as agent_sandboxes
from deathwatch._api.agent_sandbox import SandboxObject
from deathwatch._api.objects import (
    DeathWatchObject,
    EvictionNotice,
    VerdictObject,
    decode_deathwatch,
    decode_eviction,
    decode_pod_view,
    decode_sandbox,
    decode_verdict,
)
from deathwatch._api.resources import DW_PLURAL, SLOT_LABEL, SV_PLURAL, objects
from deathwatch._engine.podview import PodView
from deathwatch._operator.shards.slot_claims import Spec
from deathwatch._operator.shards.slots import selector as shard_selector
from deathwatch._operator.sources import exits
from deathwatch._operator.sources.exits import ExitsLease
from deathwatch._operator.sources.reflector import Collection


def pods(namespace: str | None, label_selector: str | None = None,
         shard_selector: str | None = None) -> Collection[PodView]:  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    return Collection("pods", path, decode_pod_view, namespace, label_selector, shard_selector)


def verdicts(namespace: str | None, label_selector: str | None = None) -> Collection[VerdictObject]:
    """`label_selector`: a shard's verdicts (`deathwatch.dev/slot in (...)`), and those from
    before sharding, which carry no slot yet (`!deathwatch.dev/slot`), as a second collection."""
    return Collection(SV_PLURAL, objects(SV_PLURAL, namespace), decode_verdict, namespace,
                      label_selector)  # fmt: skip


def deathwatches(namespace: str | None) -> Collection[DeathWatchObject]:
    return Collection(DW_PLURAL, objects(DW_PLURAL, namespace), decode_deathwatch, namespace)


def sandboxes(namespace: str | None) -> Collection[SandboxObject]:
    """agent-sandbox's Sandboxes: optional (its CRDs may come later, or never)."""
    base = f"/apis/{agent_sandboxes.GROUP}/{agent_sandboxes.VERSION}"
    path = f"{base}/namespaces/{namespace}/{agent_sandboxes.PLURAL}" if namespace else (
        f"{base}/{agent_sandboxes.PLURAL}"
    )  # fmt: skip
    return Collection(agent_sandboxes.PLURAL, path, decode_sandbox, namespace, optional=True)


def evictions(namespace: str | None) -> Collection[EvictionNotice]:
    """The Events of reason Evicted (the kubelet's, checked when decoded): few, kept an hour."""
    path = f"/api/v1/namespaces/{namespace}/events" if namespace else "/api/v1/events"
    return Collection("events", path, decode_eviction, namespace,
                      field_selector="reason=Evicted")  # fmt: skip


ADOPTING = 2  # listings of a new DeathWatch's pods that run at once beside the reflectors


@dataclass(frozen=True)
class Watched:
    """Every collection the controller keeps a reflector of, decided in one place from the
    config: what the watches client is sized from (issue #40)."""

    verdicts: tuple[Collection[VerdictObject], ...]
    deathwatches: tuple[Collection[DeathWatchObject], ...]
    sandboxes: tuple[Collection[SandboxObject], ...]
    pods: tuple[Collection[PodView], ...]
    pods_by_slot: str | None  # sharded: KEP-5866's selector of this shard's pods
    node_exits: tuple[Collection[ExitsLease], ...] = ()  # the nodes' exits Leases (ADR 0028)
    evictions: tuple[Collection[EvictionNotice], ...] = ()  # the kubelet's Evicted Events

    @classmethod
    def of(cls, scopes: tuple[str | None, ...], shard: Spec, *, agent_sandbox: bool = True,
           pod_label_selector: str | None = None, node_exits_namespace: str | None = None
           ) -> Watched:  # fmt: skip
        """What each scope (a namespace, or all) is read through."""
        # sharded: the API server filters the pod watch by slot where it can (KEP-5866), and
        # a shard watches its own verdicts, and those from before sharding (no slot label yet)
        pods_by_slot = shard_selector(shard.slots) if shard.sharded else None
        verdict_selectors: tuple[str | None, ...] = (
            (f"{SLOT_LABEL} in ({','.join(str(x) for x in sorted(shard.slots))})",
             f"!{SLOT_LABEL}") if shard.sharded else (None,)
        )  # fmt: skip
        sandbox_scopes = scopes if agent_sandbox else ()
        return cls(
            verdicts=tuple(verdicts(scope, selector)
                           for scope in scopes for selector in verdict_selectors),
            deathwatches=tuple(deathwatches(scope) for scope in scopes),
            sandboxes=tuple(sandboxes(scope) for scope in sandbox_scopes),
            pods=tuple(pods(scope, pod_label_selector, pods_by_slot) for scope in scopes),
            pods_by_slot=pods_by_slot,
            node_exits=(exits.leases(node_exits_namespace),)
            if node_exits_namespace else (),
            evictions=tuple(evictions(scope) for scope in scopes),
        )  # fmt: skip

    @property
    def reflectors(self) -> int:
        return (len(self.verdicts) + len(self.deathwatches) + len(self.sandboxes)
                + len(self.pods) + len(self.node_exits) + len(self.evictions))  # fmt: skip

    @property
    def list_connections(self) -> int:
        """The watches client's pool, for listings only (each watch streams on a connection
        of its own, rest.py): a reflector lists one page at a time, and beside them the
        DeathWatches' adoptions list their namespaces' pods."""
        return self.reflectors + ADOPTING
