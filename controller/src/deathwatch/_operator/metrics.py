"""Prometheus metrics of the operator (one registry, so tests can read it in isolation)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from deathwatch._engine.verdict import DEAD_CAUSES, Cause, origin_of

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.verdicts = Counter(
            "deathwatch_verdicts",
            "Verdict transitions, by the state entered, policy and cause",
            ["state", "policy", "cause"],
            registry=r,
        )
        self.ready_drops = Counter(
            "deathwatch_ready_drops",
            "Ready True->False transitions of tracked pods",
            ["policy"],
            registry=r,
        )
        self.flaps = Counter(
            "deathwatch_flaps",
            "Ready True->False->True before any death verdict",
            ["policy"],
            registry=r,
        )
        self.sidecar_restarts = Counter(
            "deathwatch_sidecar_restarts",
            "Restarts of sandbox pods' containers that are not the sandbox (native sidecars "
            "not named vital, helpers): evidence, never a death (ADR 0029)",
            ["policy"],
            registry=r,
        )
        self.standby_disagreements = Counter(
            "deathwatch_standby_disagreements",
            "Final verdicts a standby had judged otherwise than the leader wrote them (the "
            "written one stands, and the standby takes it): 0 unless the replicas' views "
            "diverged",
            registry=r,
        )
        self.false_positives = Counter(
            "deathwatch_false_positives",
            "Pods Ready again after a Dead verdict",
            ["policy"],
            registry=r,
        )
        self.node_exits = Counter(
            "deathwatch_node_exits",
            "Container exits heard on the nodes (ADR 0028), by what came of them: judged (a "
            "verdict step), not-watched (no tracked sandbox's running container: another "
            "instance, an init container, another shard's pod), kubelet (only the kubelet "
            "can tell what it leads to, or the verdict was final already), gone (the pod "
            "was deleted), unread (the pod could not be read), busy (too many reads at once), "
            "settled (a standby's: the verdict was final when its deferred judgement came)",
            ["outcome"],
            registry=r,
        )
        self.node_exit_delivery = Histogram(
            "deathwatch_node_exit_delivery_seconds",
            "From a container's exit (its node's clock) to the controller reading it on the "
            "node's exits Lease",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.node_exit_disputes = Counter(
            "deathwatch_node_exit_disputes",
            "Deaths heard on the node that the kubelet's report told otherwise (the verdict "
            "stands; a NodeExitDisputed Event says how)",
            ["policy"],
            registry=r,
        )
        self.verdict_latency = Histogram(
            "deathwatch_verdict_latency_seconds",
            "From the pod's Ready-drop time (kubelet clock, 1 s precision; a death heard on "
            "its node: the exit, to the microsecond) to Dead written",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.processing_latency = Histogram(
            "deathwatch_verdict_processing_seconds",
            "From the pod event received to the Dead verdict written (the controller's own share)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.deaths = Counter(
            "deathwatch_sandbox_deaths",
            "Sandboxes declared Dead, by node, cause and origin (Workload: its own doing; "
            "Infrastructure: a drain, preemption, taint eviction, node lost, deleted, shut down "
            "or pressed)",
            ["node", "cause", "origin"],
            registry=r,
        )
        self._death_nodes: set[str] = set()
        self.node_sandboxes = Gauge(
            "deathwatch_node_sandboxes",
            "Live sandboxes per node, by their Shielded status (True, False, Unknown; Audit: "
            "False because the node's firewall audits on purpose; none: no firewall configured)",
            ["node", "shielded"],
            registry=r,
        )
        self.write_backlog = Gauge(
            "deathwatch_write_backlog",
            "Objects waiting to be written (queued, in flight, backing off) or owed by a standby",
            registry=r,
        )
        self.write_retries = Counter(
            "deathwatch_write_retries",
            "Writes that failed and will be tried again after a backoff",
            ["resource"],
            registry=r,
        )
        self.tracked = Gauge(
            "deathwatch_tracked_pods", "Tracked pods by verdict state", ["state"], registry=r
        )
        self.api_errors = Counter(
            "deathwatch_api_errors",
            "Failed Kubernetes API calls",
            ["operation", "code"],
            registry=r,
        )
        self.api_writes = Counter(
            "deathwatch_api_writes",
            "Kubernetes API writes, by operation",
            ["operation"],
            registry=r,
        )
        self.foreign_writes = Counter(
            "deathwatch_foreign_writes",
            "Writes to deathwatch's objects seen while this replica led that were not its own "
            "(another term's write held up in the network and landing late, or a person)",
            ["resource"],
            registry=r,
        )
        self.writes_refused = Counter(
            "deathwatch_writes_refused",
            "Writes the API refused for good (a 4xx but conflicts): each status is logged once "
            "and not sent again until it changes",
            ["resource", "code"],
            registry=r,
        )
        self.task_restarts = Counter(
            "deathwatch_task_restarts",
            "Crashes of a supervised long-running task (each followed by a restart)",
            ["task"],
            registry=r,
        )
        self.handler_errors = Counter(
            "deathwatch_handler_errors",
            "Unexpected errors in a watch event handler (logged with traceback; event skipped)",
            ["handler"],
            registry=r,
        )
        self.policy_errors = Counter(
            "deathwatch_policy_errors",
            "judge() calls of a policy that raised, returned garbage or timed out",
            ["policy"],
            registry=r,
        )
        self.relists = Counter(
            "deathwatch_watch_relists",
            "Watches that could not resume (410 Gone) and were followed by a new listing",
            ["resource"],
            registry=r,
        )
        self.leader = Gauge(
            "deathwatch_leader",
            "1 while this replica holds the Lease and may write, else 0",
            ["identity"],
            registry=r,
        )
        self.watch_connections = Counter(
            "deathwatch_watch_connections",
            "Watch requests made per resource (one per server timeout, more after faults)",
            ["resource"],
            registry=r,
        )
        self.watch_not_open = Gauge(
            "deathwatch_watch_not_open",
            "1 while a watched collection has not been listed within its deadline (30 s) of "
            "the reflector's start: start-up and readiness wait for it; /readyz names it",
            ["resource", "scope"],
            registry=r,
        )
        self.watch_activity = Gauge(
            "deathwatch_watch_stream_activity_timestamp_seconds",
            "When a watch stream last delivered anything, bookmarks included (unix time)",
            ["resource"],
            registry=r,
        )
        self.last_event = Gauge(
            "deathwatch_watch_last_event_timestamp_seconds",
            "When the last watch event of a resource arrived (unix time)",
            ["resource"],
            registry=r,
        )
        self.shielded = Gauge(
            "deathwatch_sandboxes_shielded",
            "Live sandboxes by their Shielded condition (True, False, Unknown): is the node "
            "firewall on their node current and covering them",
            ["status"],
            registry=r,
        )
        self.unshielded_spells = Counter(
            "deathwatch_sandbox_unshielded_spells",
            "Sandboxes that lost (or never had) a current node firewall, by reason",
            ["reason"],
            registry=r,
        )
        self.gc_pauses = Histogram(
            "deathwatch_gc_pause_seconds",
            "How long each garbage collection stopped the process, by generation (gcpauses.py)",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.coverage_nodes = Gauge(
            "deathwatch_firewall_coverage_nodes",
            "Nodes whose firewall agent publishes a coverage Lease (as last listed)",
            registry=r,
        )

        self.delivery_events = Counter(
            "deathwatch_delivery_events",
            "Events sent to an end, by sink and outcome: delivered (2xx), refused (a 4xx other "
            "than 408 and 429: not sent again), expired (owed past the sink's maxAge)",
            ["sink", "outcome"],
            registry=r,
        )
        self.delivery_retries = Counter(
            "deathwatch_delivery_retries",
            "Attempts that will be made again, by sink and why (an HTTP status, connection, "
            "timeout, tls, keys)",
            ["sink", "reason"],
            registry=r,
        )
        self.delivery_coalesced = Counter(
            "deathwatch_delivery_coalesced",
            "Alive and Suspect events superseded by the sandbox's next transition before they "
            "could be delivered (Dead and Gone never are)",
            ["sink"],
            registry=r,
        )
        self.delivery_backlog = Gauge(
            "deathwatch_delivery_backlog",
            "Sandboxes whose current transition a sink is owed (not delivered yet)",
            ["sink"],
            registry=r,
        )
        self.delivery_oldest = Gauge(
            "deathwatch_delivery_oldest_undelivered_seconds",
            "Age of the oldest transition a sink is owed (0: none)",
            ["sink"],
            registry=r,
        )
        self.delivery_unanswered = Gauge(
            "deathwatch_delivery_unanswered_attempts",
            "Attempts in a row that got no answer at all (refused connection, timeout, TLS): "
            "a receiver that is not there. 0 once one answers, even with a 429 or a 5xx",
            ["sink"],
            registry=r,
        )
        self.delivery_latency = Histogram(
            "deathwatch_delivery_latency_seconds",
            "From the transition (the verdict's time) to the receiver's 2xx",
            ["sink"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

        self.shard_owned_slots = Gauge(
            "deathwatch_shard_owned_slots",
            "Slots (of 64) this replica writes now: all of them for the leader of the only "
            "shard, its share for a shard's leader, 0 for a standby",
            ["shard"],
            registry=r,
        )
        self.shard_filtered = Counter(
            "deathwatch_shard_filtered",
            "Objects of another shard's slots dropped here (where: pods, verdicts): none when "
            "the API server filters the pod watch (KEP-5866); all of them when it does not",
            ["where"],
            registry=r,
        )
        self.shard_server_filtered = Gauge(
            "deathwatch_shard_server_filtered",
            "1 when the API server applied this shard's pod selector (it echoed it back), 0 "
            "when the filter runs here only",
            registry=r,
        )

    def sinks_known(self, names: Iterable[str]) -> None:
        """Every sink's series from the start, at 0 (a first refusal must show in increase())."""
        for name in names:
            for outcome in ("delivered", "refused", "expired"):
                self.delivery_events.labels(name, outcome)
            self.delivery_coalesced.labels(name)
            self.delivery_backlog.labels(name).set(0)
            self.delivery_oldest.labels(name).set(0)

    def death(self, node: str, cause: Cause) -> None:
        self.node_seen(node)
        self.deaths.labels(node, str(cause), str(origin_of(cause))).inc()

    def node_seen(self, node: str) -> None:
        """Start a node's death counters at 0 the first time a sandbox is seen on it: increase()
        ignores a series' first sample, so deaths that create their own series (a whole node
        dying between two scrapes) would never show in a rate or fire an alert."""
        if node not in self._death_nodes:
            self._death_nodes.add(node)
            for cause in DEAD_CAUSES:
                self.deaths.labels(node, str(cause), str(origin_of(cause)))

    def policies_known(self, names: Iterable[str]) -> None:
        """Start every policy's counters at 0: a policy's first error must show in increase()."""
        for name in names:
            for counter in (self.policy_errors, self.flaps, self.false_positives, self.ready_drops,
                            self.node_exit_disputes, self.sidecar_restarts):  # fmt: skip
                counter.labels(name)
        for outcome in ("judged", "not-watched", "kubelet", "gone", "unread", "busy", "settled"):
            self.node_exits.labels(outcome)
