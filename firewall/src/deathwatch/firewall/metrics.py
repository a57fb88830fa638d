"""Prometheus metrics of the firewall agent."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class FirewallMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.syncs = Counter(
            "deathwatch_firewall_syncs",
            "Syncs of the live table: unchanged, applied (start or new config) or repaired (drift)",
            ["result"],
            registry=r,
        )
        self.sync_failures = Counter(
            "deathwatch_firewall_sync_failures",
            "Failed syncs, by reason (nft, config, sandboxes: the pod list, coverage: the Lease,"
            " watch: the pod watch, nodes: the node watch, deathwatches: the DeathWatch watch,"
            " releases: the releases' DaemonSets, state: the state file)",
            ["reason"],
            registry=r,
        )
        self.rule_present = Gauge(
            "deathwatch_firewall_rule_present",
            "1 when the live table matches the configured rule exactly",
            registry=r,
        )
        self.rejected = Counter(
            "deathwatch_firewall_packets_rejected",
            "Packets refused with a TCP reset (summed from the rule counters across replacements)",
            registry=r,
        )
        self.last_sync = Gauge(
            "deathwatch_firewall_last_sync_timestamp_seconds",
            "When the table was last checked",
            registry=r,
        )
        self.apply_seconds = Histogram(
            "deathwatch_firewall_apply_seconds",
            "Time of one atomic table replacement (nft -f)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=r,
        )
        self.table_replaced = Counter(
            "deathwatch_firewall_table_replaced",
            "Times the table was found replaced (changed) or removed under the agent, and "
            "repaired; again and again within minutes makes it contested (another writer)",
            ["how"],
            registry=r,
        )
        for how in ("changed", "removed"):
            self.table_replaced.labels(how)
        self.release_collisions = Gauge(
            "deathwatch_firewall_release_collisions",
            "1 while another release's firewall, applied first, holds this agent's table "
            "(other: its NAMESPACE/RELEASE): this agent leaves the table alone (ADR 0038)",
            ["what", "other", "yields"],
            registry=r,
        )
        self.sandboxes = Gauge(
            "deathwatch_firewall_sandboxes",
            "Sandbox pods of this node guarded by the inbound rule (as last listed)",
            registry=r,
        )
        # finite label sets: their series exist, at 0, from the start (a rate is 0, not absent)
        for reason in (
            "nft",
            "config",
            "sandboxes",
            "coverage",
            "watch",
            "nodes",
            "deathwatches",
            "state",
        ):
            self.sync_failures.labels(reason)
        for result in ("unchanged", "applied", "repaired"):
            self.syncs.labels(result)
        self.host_addresses = Gauge(
            "deathwatch_firewall_host_addresses",
            "Hosts' own addresses inside the pod ranges (overlay tunnels), refused inbound",
            registry=r,
        )
        self.inbound_enforced = Gauge(
            "deathwatch_firewall_inbound_enforced",
            "1 when the inbound rule is in the table; 0 while it waits for complete pod ranges "
            "(podCIDRs not given and a node without spec.podCIDRs) or is turned off",
            registry=r,
        )
        self.pod_ranges = Gauge(
            "deathwatch_firewall_pod_ranges",
            "Pod ranges the rules use: configured podCIDRs and the nodes' spec.podCIDRs",
            registry=r,
        )
        self.self_checks = Counter(
            "deathwatch_firewall_self_checks",
            "The agent's own connections from the host to a sandbox's agent port, by what they "
            "showed: verified (refused by our rule), bypassed (accepted: the table is skipped), "
            "inconclusive, none (no sandbox on this node to try)",
            ["outcome"],
            registry=r,
        )
        for measured in ("verified", "bypassed", "inconclusive", "none"):
            self.self_checks.labels(measured)
        self.rule_bypassed = Gauge(
            "deathwatch_firewall_rule_bypassed",
            "1 when the last self-check connected from the host to a sandbox's agent port",
            registry=r,
        )
        self.audited = Counter(
            "deathwatch_firewall_audited_connections",
            "Audit mode: connections the rules would have refused and let through, by agent "
            "port and kind of source: host (this node: a process or a hostNetwork pod), outside "
            "(outside the pod ranges: another node, a NodePort client), host-in-pod-range (a "
            "host's own address inside them: an overlay's tunnel)",
            ["port", "source"],
            registry=r,
        )
        self.enforcing = Gauge(
            "deathwatch_firewall_enforcing",
            "1 when this node refuses (mode enforce), 0 when it only audits",
            registry=r,
        )
        self.coverage_published = Gauge(
            "deathwatch_firewall_coverage_published_timestamp_seconds",
            "When this node's coverage Lease was last renewed",
            registry=r,
        )
