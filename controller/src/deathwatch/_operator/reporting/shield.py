"""Is this sandbox shielded? The firewall agents' coverage Leases joined with each sandbox's
node, address and agent ports. Pure functions over plain data.

Each firewall agent renews a Lease per node (its format: deathwatch._kube.coverage;
tests/netns/test_shield.py holds both sides to one format) saying which config it enforces, whether
the table is in force, and for how long the claim holds. A sandbox is shielded when its node's
claim is current, the rule is in force, the agent enforces the config it was given, and that
config covers the sandbox: its address in the pod ranges, its agent ports in the refused ones.

Staleness is judged on this process's monotonic clock from when a renewal was first seen, as
client-go's leader election does, so clock skew between nodes cannot make a dead agent look
alive; the renewal's own age counts only at first sight, capped by how often Leases are read.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from deathwatch._api.resources import ConditionStatus
from deathwatch._kube import coverage as wire

# the one format of the agents' coverage Leases (the agents write it, this reads it)
SELECTOR = wire.SELECTOR
NodeCoverage = wire.NodeCoverage  # one node's claim, as its Lease says it
read_lease = wire.read

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ShieldReason:
    """Reasons of a SandboxVerdict's Shielded condition."""

    IN_FORCE = "RuleInForce"
    NO_AGENT = "NoAgent"
    AGENT_STALE = "AgentStale"
    RULE_MISSING = "RuleMissing"
    CONFIG_MISMATCH = "ConfigMismatch"
    NOT_SCHEDULED = "NotScheduled"
    NOT_OBSERVED = "NotObserved"
    HOSTS_UNKNOWN = "HostAddressesUnknown"  # the inbound rule cannot tell some hosts from pods
    POD_RANGES_UNKNOWN = "PodRangesUnknown"  # the inbound rule waits for complete pod ranges
    OUTSIDE_POD_RANGES = "OutsidePodRanges"  # the sandbox's address is in no known pod range
    RULE_BYPASSED = "RuleBypassed"  # the agent's own host connection to a sandbox got through
    AUDIT = "Audit"  # the node's firewall audits: it counts what it would refuse, refuses none
    # the agent does not guard this pod: its sandbox selector leaves it out, or its inbound
    # rule has not held the pod's address for a whole claim
    NOT_GUARDED = "NotGuarded"
    CONTESTED = "TableContested"  # its table is replaced under it again and again


@dataclass(frozen=True, slots=True)
class Sighting:
    """When this process first saw a node's current renewal (monotonic seconds), with the age
    the renewal already had then."""

    renew_time: str
    seen_at: float
    age_then: float


def sight(
    previous: Sighting | None, coverage: NodeCoverage, now: datetime, now_mono: float, cap: float
) -> Sighting:
    if previous is not None and previous.renew_time == coverage.renew_time:
        return previous
    age = (now - coverage.renewed_at).total_seconds() if coverage.renewed_at else cap
    return Sighting(coverage.renew_time, now_mono, min(max(age, 0.0), cap))


@dataclass(frozen=True, slots=True)
class Shield:
    status: ConditionStatus
    reason: str
    message: str

    @property
    def audited(self) -> bool:
        """Not shielded because its node audits on purpose (a staged rollout): not exposed
        by accident, so neither an uncovered node nor a SandboxUnshielded spell."""
        return self.reason == ShieldReason.AUDIT

    @property
    def exposed(self) -> bool:
        return self.status is ConditionStatus.FALSE and not self.audited


def assess(
    node: str | None,
    pod_ips: Iterable[str],
    agent_ports: Iterable[int],
    coverage: NodeCoverage | None,
    sighting: Sighting | None,
    now_mono: float,
    observed: bool,
    labels: Mapping[str, str] | None = None,
    addressed_at: float | None = None,
) -> Shield:
    """The Shielded condition of one sandbox: `labels`, its pod's (checked against the
    agent's sandbox selector); `addressed_at`, when this process first saw its addresses
    (monotonic: checked against the addresses the inbound rule holds, once the agent has
    renewed its claim a whole validity later). Asked in order: is an agent reporting for its
    node, is that agent's table in force as configured, does it cover this sandbox."""
    u, f = ConditionStatus.UNKNOWN, ConditionStatus.FALSE
    if not observed:
        return Shield(u, ShieldReason.NOT_OBSERVED, "the firewall coverage Leases were not read")
    if not node:
        return Shield(u, ShieldReason.NOT_SCHEDULED, "not on a node yet")
    if coverage is None or sighting is None:
        return Shield(f, ShieldReason.NO_AGENT, f"no firewall agent reports for node {node}")
    ips = list(pod_ips)
    return (
        _agent_stale(node, coverage, sighting, now_mono)
        or _table_not_in_force(node, coverage)
        or _sandbox_left_out(node, coverage, sighting, ips, agent_ports, labels, addressed_at)
        or _in_force(node, coverage)
    )


def _agent_stale(node: str, coverage: NodeCoverage, sighting: Sighting,
                 now_mono: float) -> Shield | None:  # fmt: skip
    age = sighting.age_then + (now_mono - sighting.seen_at)
    if age <= coverage.valid_for:
        return None
    return Shield(
        ConditionStatus.FALSE,
        ShieldReason.AGENT_STALE,
        f"the firewall agent on {node} ({coverage.holder}) last reported at "
        f"{coverage.renew_time}, valid for {coverage.valid_for:.0f}s",
    )


def _table_not_in_force(node: str, coverage: NodeCoverage) -> Shield | None:
    """Why the node's table does not refuse as configured: another release holds it, it is
    rewritten under the agent, missing, bypassed by the datapath, auditing, on an old config,
    or its inbound rule waits for the pod ranges."""
    f = ConditionStatus.FALSE
    if coverage.held_by:
        return Shield(
            f,
            ShieldReason.CONTESTED,
            f"table inet {coverage.table} on {node} is held by the firewall of "
            f"{coverage.held_by}, applied first: this release's agent leaves it alone and "
            "enforces nothing there; give one release its own firewall.table (ADR 0038)",
        )
    if coverage.contested:
        return Shield(
            f,
            ShieldReason.CONTESTED,
            f"the firewall agent on {node} finds its table inet {coverage.table} replaced "
            "again and again (another release's agent writing the same table, or something "
            "on the node rewriting it): its rule is out of force between each replacement "
            "and its repair; give each release its own firewall.table",
        )
    if not coverage.rule_in_force:
        return Shield(
            f,
            ShieldReason.RULE_MISSING,
            f"the firewall agent on {node} reports its table is not in force",
        )
    if coverage.measured == "bypassed":
        return Shield(
            f,
            ShieldReason.RULE_BYPASSED,
            f"the firewall agent on {node} connected from the host to a sandbox's agent port "
            "with its table in force: this node's datapath skips the table (runbook: "
            "SandboxUnshielded)",
        )
    if coverage.mode == "audit":
        return Shield(
            f,
            ShieldReason.AUDIT,
            f"the firewall on {node} audits: it counts what its rules would refuse "
            "(deathwatch_firewall_audited_connections_total) and refuses nothing; it enforces "
            "once firewall.mode is enforce or the node matches firewall.enforceNodeSelector",
        )
    if coverage.config_file != coverage.config:
        return Shield(
            f,
            ShieldReason.CONFIG_MISMATCH,
            f"the firewall agent on {node} refused its new config and enforces the previous one",
        )
    if coverage.inbound and coverage.pod_ranges_unknown:
        which = (
            "no node with a spec.podCIDRs was listed"
            if coverage.pod_ranges_unknown == "*"
            else f"nodes without spec.podCIDRs: {coverage.pod_ranges_unknown.replace(',', ', ')}"
        )
        return Shield(
            f,
            ShieldReason.POD_RANGES_UNKNOWN,
            f"the firewall agent on {node} holds the inbound rule back: the pod ranges are not "
            f"known to be complete ({which}); set firewall.podCIDRs to the cluster's pod ranges",
        )
    return None


def _sandbox_left_out(node: str, coverage: NodeCoverage, sighting: Sighting, pod_ips: list[str],
                      agent_ports: Iterable[int], labels: Mapping[str, str] | None,
                      addressed_at: float | None) -> Shield | None:  # fmt: skip
    """Why the table in force does not cover this sandbox: an address outside the pod ranges,
    an agent port it does not guard, a pod its rules leave out, hosts it cannot tell."""
    f = ConditionStatus.FALSE
    outside = [ip for ip in pod_ips if not _within(ip, coverage.pod_cidrs)]
    if outside:
        known = ", ".join(str(n) for n in coverage.pod_cidrs) or "none"
        return Shield(
            f,
            ShieldReason.OUTSIDE_POD_RANGES,
            f"address {outside[0]} is in no pod range the firewall on {node} knows ({known}): "
            "the rules leave it out; add its range to firewall.podCIDRs",
        )
    unguarded = sorted(set(agent_ports) - coverage.agent_ports)
    if unguarded:
        return Shield(
            f,
            ShieldReason.CONFIG_MISMATCH,
            f"agent port {unguarded[0]} is not among the firewall's agentPorts on {node}",
        )
    if coverage.inbound:
        left_out = _left_out(coverage, pod_ips, labels, addressed_at, sighting)
        if left_out is not None:
            return Shield(f, ShieldReason.NOT_GUARDED, f"the firewall agent on {node} {left_out}")
    if coverage.inbound and coverage.hosts_unknown:
        which = (
            "no node was listed yet"
            if coverage.hosts_unknown == "*"
            else f"nodes {coverage.hosts_unknown.replace(',', ', ')}"
        )
        return Shield(
            f,
            ShieldReason.HOSTS_UNKNOWN,
            f"the firewall agent on {node} does not know every host's address in the pod "
            f"ranges ({which}): a host there could reach this sandbox from a tunnel address",
        )
    return None


def _in_force(node: str, coverage: NodeCoverage) -> Shield:
    inbound = "both rules" if coverage.inbound else "the output rule (inbound is off)"
    measured = (
        "; a host connection to a sandbox was refused by it (measured)"
        if coverage.measured == "verified"
        else ""
    )
    repaired = (
        f"; its table was replaced under it and repaired {coverage.repairs} time(s), last "
        f"at {coverage.repaired_at}"
        if coverage.repaired_at
        else ""
    )
    return Shield(
        ConditionStatus.TRUE,
        ShieldReason.IN_FORCE,
        f"the firewall agent on {node} enforces {inbound} in table inet {coverage.table} "
        f"(config {coverage.config}){measured}{repaired}",
    )


def pending(coverage: NodeCoverage | None, pod_ips: Iterable[str], addressed_at: float | None
            ) -> float | None:  # fmt: skip
    """When a sandbox shielded only while its agent has not yet had a whole claim to put its
    address in the inbound rule must be judged again (monotonic); None: nothing pending."""
    if (
        coverage is None
        or not coverage.inbound
        or coverage.guarded is None
        or addressed_at is None
        or all(ip in coverage.guarded for ip in pod_ips)
    ):
        return None
    return addressed_at + coverage.valid_for


def _left_out(
    coverage: NodeCoverage,
    pod_ips: list[str],
    labels: Mapping[str, str] | None,
    addressed_at: float | None,
    sighting: Sighting | None,
) -> str | None:
    """Why the agent's inbound rule leaves this sandbox out, if it does: its selector does not
    select the pod (what the DeathWatch selects is not what the agent guards); or the rule
    has not held its address though the agent renewed its claim a whole validity after this
    process first saw the address (its next listing would have put it there)."""
    if (
        coverage.selector is not None
        and labels is not None
        and not wire.selection(coverage.selector).matches(labels)
    ):
        chosen = f"{coverage.selector!r}" if coverage.selector else "every pod"
        return (
            f"does not guard this pod: its sandbox selector ({chosen}) does not select "
            "it, so its inbound rule leaves it out; leave firewall.sandboxSelector empty "
            "(the default) and it guards exactly the pods your DeathWatches select"
        )
    if coverage.guarded is None or addressed_at is None or sighting is None:
        return None
    missing = [ip for ip in pod_ips if ip not in coverage.guarded]
    if missing and sighting.seen_at - addressed_at > coverage.valid_for:
        return (
            f"has not put address {missing[0]} in its inbound rule, a whole claim "
            f"({coverage.valid_for:.0f}s) after the pod had it"
        )
    return None


def _within(ip: str, networks: tuple[Network, ...]) -> bool:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(address in n for n in networks)
