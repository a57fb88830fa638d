"""The node's coverage, published as a Lease: "this node is shielded, with this config".

One `coordination.k8s.io/v1` Lease per node, in the agent's namespace, renewed at every
resync. A Lease because it is what Kubernetes uses for exactly this ("this holder is alive as
of renewTime, for leaseDurationSeconds": node heartbeats in kube-node-lease): a reader judges
staleness on its own clock with no extra convention, the object is tiny, and RBAC can give the
agent leases in one namespace and nothing else (docs/adr/0012). What the node enforces rides in
annotations, in the one format both sides import (deathwatch._kube.coverage: the agent writes
it, the controller reads it).

`lease_body` is pure; `publish` is the one call that makes the API agree (get, then create or
update with the resourceVersion read: two agents on one node would conflict, not interleave).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from deathwatch._kube import coverage as wire
from deathwatch._kube.coverage import LABELS, LEASE_PREFIX, VALIDITY, NodeCoverage, lease_name
from deathwatch._kube.errors import ApiError
from deathwatch.firewall.config import Address, FirewallConfig
from deathwatch.firewall.hosts import Hosts, ranges_unknown
from deathwatch.firewall.kubeapi import Api

__all__ = ["LABELS", "LEASE_PREFIX", "NodeState", "lease_body", "lease_name", "publish"]
KNOWN_NONE = Hosts((), (), (), ())  # outside a cluster: no other node, nothing to learn


@dataclass(frozen=True)
class NodeState:
    """What the agent knows after a resync."""

    config: FirewallConfig
    config_file: str  # the digest of the mounted file's config, "invalid" if it was refused
    rule_in_force: bool
    sandboxes: int | None  # None: the sandbox list could not be read
    hosts: Hosts = KNOWN_NONE  # the hosts' addresses in force (unknown None: not listed)
    measured: str = "none"  # the output rule's self-check (selfcheck.Measured)
    mode: str = "enforce"  # this node's: enforce, or audit
    table: str = "deathwatch"
    guarded: tuple[Address, ...] | None = None  # the inbound rule's sandboxes (None: off)
    repairs: int = 0
    repaired_at: datetime | None = None
    contested: bool = False
    held_by: str = ""  # the release whose firewall holds this table (rivals.py)


def unknown_hosts(hosts: Hosts) -> str:
    """The nodes whose host addresses are not in the rule: "" none, "*" not listed at all."""
    return wire.nodes(hosts.unknown)


def lease_body(
    node: str,
    identity: str,
    namespace: str,
    state: NodeState,
    now: datetime,
    prefix: str = LEASE_PREFIX,
) -> dict[str, Any]:
    """The node's coverage Lease for what the agent enforces now (the format: _kube.coverage)."""
    config = state.config
    waits = ranges_unknown(config, state.hosts) if config.inbound else ()
    claim = NodeCoverage(
        node=node,
        holder=identity,
        renew_time=wire.stamp(now),
        renewed_at=now,
        valid_for=max(1, math.ceil(config.resync_seconds * VALIDITY)),
        config=config.digest(),
        config_file=state.config_file,
        rule_in_force=state.rule_in_force,
        pod_cidrs=config.with_pod_ranges(state.hosts.ranges).pod_cidrs,
        agent_ports=frozenset(config.agent_ports),
        inbound=config.inbound,
        hosts_unknown=unknown_hosts(state.hosts) if config.inbound else "",
        pod_ranges_unknown="" if waits == () else wire.nodes(waits),
        measured=state.measured,
        mode=state.mode,
        table=state.table,
        selector=config.sandbox_selector or None,  # none: the DeathWatches' pods (ADR 0037)
        guarded=frozenset(str(a) for a in state.guarded) if state.guarded is not None else None,
        repairs=state.repairs,
        repaired_at=wire.stamp(state.repaired_at) if state.repaired_at else "",
        contested=state.contested or bool(state.held_by),
        held_by=state.held_by,
        sandboxes=state.sandboxes,
        host_addresses=len(state.hosts.addresses),
    )
    return wire.lease(claim, namespace, prefix)


def publish(api: Api, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    path = f"/apis/coordination.k8s.io/v1/namespaces/{meta['namespace']}/leases"
    try:
        current = api.call("GET", f"{path}/{meta['name']}")
    except ApiError as exc:
        if not exc.not_found:
            raise
        body["spec"]["acquireTime"] = body["spec"]["renewTime"]
        api.call("POST", path, body)
        return
    body["metadata"] = {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}
    body["spec"]["acquireTime"] = (current.get("spec") or {}).get("acquireTime")
    if (current.get("spec") or {}).get("holderIdentity") != body["spec"]["holderIdentity"]:
        body["spec"]["acquireTime"] = body["spec"]["renewTime"]  # a new agent pod
    api.call("PUT", f"{path}/{meta['name']}", body)
