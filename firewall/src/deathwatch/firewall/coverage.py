"""The node's coverage, published as a Lease: "this node is shielded, with this config".

One `coordination.k8s.io/v1` Lease per node, in the agent's namespace, renewed at every
resync. A Lease because it is what Kubernetes uses for exactly this ("this holder is alive as
of renewTime, for leaseDurationSeconds": node heartbeats in kube-node-lease): a reader judges
staleness on its own clock with no extra convention, the object is tiny, and RBAC can give the
agent leases in one namespace and nothing else (docs/adr/0012). What the node enforces rides in
annotations, read by the controller (deathwatch/_operator/shield.py; tests/netns/test_shield.py
holds the two to one format).

`lease_body` is pure; `publish` is the one call that makes the API agree (get, then create or
update with the resourceVersion read: two agents on one node would conflict, not interleave).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from deathwatch._kube.errors import ApiError
from deathwatch.firewall.config import Address, FirewallConfig
from deathwatch.firewall.hosts import Hosts, ranges_unknown
from deathwatch.firewall.kubeapi import Api

PREFIX = "deathwatch.dev/"
NODE, CONFIG, CONFIG_FILE, RULE = (
    f"{PREFIX}{k}" for k in ("node", "config", "config-file", "rule")
)
POD_CIDRS, AGENT_PORTS, INBOUND, SANDBOXES = (
    f"{PREFIX}{k}" for k in ("pod-cidrs", "agent-ports", "inbound", "sandboxes")
)
# every node's host addresses inside the pod ranges, as the inbound rule refuses them: how
# many, and the nodes whose addresses could not be learned ("*": the nodes were not listed)
HOST_ADDRESSES, HOSTS_UNKNOWN = f"{PREFIX}host-addresses", f"{PREFIX}hosts-unknown"
# why the inbound rule waits for complete pod ranges: "" it does not, "*" the nodes were not
# listed (or none has a podCIDR), else the nodes with no spec.podCIDRs (podCIDRs not given)
POD_RANGES_UNKNOWN = f"{PREFIX}pod-ranges-unknown"
# the output rule as the agent last measured it: verified, bypassed, inconclusive or none
# (selfcheck.py); bypassed unshields the node's sandboxes
RULE_MEASURED = f"{PREFIX}rule-measured"
# enforce (refused) or audit (counted and let through: its sandboxes are not shielded)
MODE = f"{PREFIX}mode"
# what the agent guards (ADR 0029): its table (inet TABLE), the label selector that picks
# this node's sandboxes, and the addresses its inbound rule holds (absent: inbound is not
# enforced); how many times its table was replaced or removed under it and repaired, when
# last; RULE says "contested" while that keeps happening (another writer of the same table)
TABLE, SANDBOX_SELECTOR, GUARDED = (f"{PREFIX}{k}" for k in ("table", "sandbox-selector",
                                                             "guarded"))  # fmt: skip
REPAIRS, REPAIRED_AT = f"{PREFIX}repairs", f"{PREFIX}repaired-at"
UNKNOWN_SHOWN = 20  # nodes named in the annotation; more are counted
LABELS = {
    "app.kubernetes.io/name": "deathwatch",
    "app.kubernetes.io/component": "firewall-coverage",
}
# published at every resync; valid for 1.5 of them, so one late renewal is not a gap, and a
# stopped agent is seen within 2 resyncs
VALIDITY = 1.5


LEASE_PREFIX = "deathwatch-firewall"  # the chart passes RELEASE-firewall (--lease-prefix)


def lease_name(node: str, prefix: str = LEASE_PREFIX) -> str:
    """PREFIX.NODE; hashed where that would pass the 253 characters an object name may have
    (the chart's admission policy then checks the annotation alone)."""
    name = f"{prefix}.{node}"
    if len(name) > 253:
        name = f"{prefix}.{hashlib.sha256(node.encode()).hexdigest()[:32]}"
    return name


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


def unknown_hosts(hosts: Hosts) -> str:
    """The nodes whose host addresses are not in the rule: "" none, "*" not listed at all."""
    return _nodes(hosts.unknown)


def _nodes(nodes: tuple[str, ...] | None) -> str:
    if nodes is None:
        return "*"
    shown = ",".join(nodes[:UNKNOWN_SHOWN])
    more = len(nodes) - UNKNOWN_SHOWN
    return f"{shown},+{more}" if more > 0 else shown


def lease_body(
    node: str,
    identity: str,
    namespace: str,
    state: NodeState,
    now: datetime,
    prefix: str = LEASE_PREFIX,
) -> dict[str, Any]:
    config = state.config
    ranges = config.with_pod_ranges(state.hosts.ranges).pod_cidrs
    waits = ranges_unknown(config, state.hosts) if config.inbound else ()
    stamp = _stamp(now)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name(node, prefix),
            "namespace": namespace,
            "labels": LABELS,
            "annotations": {
                NODE: node,
                CONFIG: config.digest(),
                CONFIG_FILE: state.config_file,
                RULE: "contested"
                if state.contested
                else "in-force"
                if state.rule_in_force
                else "missing",
                POD_CIDRS: ",".join(str(n) for n in ranges),
                AGENT_PORTS: ",".join(str(p) for p in config.agent_ports),
                INBOUND: "true" if config.inbound else "false",
                SANDBOXES: "unknown" if state.sandboxes is None else str(state.sandboxes),
                HOST_ADDRESSES: str(len(state.hosts.addresses)),
                HOSTS_UNKNOWN: unknown_hosts(state.hosts) if config.inbound else "",
                POD_RANGES_UNKNOWN: "" if waits == () else _nodes(waits),
                RULE_MEASURED: state.measured,
                MODE: state.mode,
                TABLE: state.table,
                SANDBOX_SELECTOR: config.sandbox_selector,
                **(
                    {GUARDED: ",".join(str(a) for a in state.guarded)}
                    if state.guarded is not None
                    else {}
                ),
                REPAIRS: str(state.repairs),
                **({REPAIRED_AT: _stamp(state.repaired_at)} if state.repaired_at else {}),
            },
        },
        "spec": {
            "holderIdentity": identity,
            "leaseDurationSeconds": max(1, math.ceil(config.resync_seconds * VALIDITY)),
            "renewTime": stamp,
        },
    }


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
