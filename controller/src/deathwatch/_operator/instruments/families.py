"""The controller's metric families, declared once each, in groups by what they count;
`Metrics` (metrics.py) is all of them in one registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from deathwatch._operator.instruments.declare import LATENCY_BUCKETS, counter, gauge, histogram


class VerdictFamilies:
    """What the engine judged: transitions, deaths and how soon they were written."""

    verdicts: Counter = counter(
        "deathwatch_verdicts",
        "Verdict transitions, by the state entered, policy and cause",
        labels=("state", "policy", "cause"),
    )
    ready_drops: Counter = counter(
        "deathwatch_ready_drops",
        "Ready True->False transitions of tracked pods",
        labels=("policy",),
    )
    flaps: Counter = counter(
        "deathwatch_flaps",
        "Ready True->False->True before any death verdict",
        labels=("policy",),
    )
    sidecar_restarts: Counter = counter(
        "deathwatch_sidecar_restarts",
        "Restarts of sandbox pods' containers that are not the sandbox (native sidecars not named "
        "vital, helpers): evidence, never a death (ADR 0029)",
        labels=("policy",),
    )
    standby_disagreements: Counter = counter(
        "deathwatch_standby_disagreements",
        "Final verdicts a standby had judged otherwise than the leader wrote them (the written one "
        "stands, and the standby takes it): 0 unless the replicas' views diverged",
    )
    false_positives: Counter = counter(
        "deathwatch_false_positives",
        "Pods Ready again after a Dead verdict",
        labels=("policy",),
    )
    verdict_latency: Histogram = histogram(
        "deathwatch_verdict_latency_seconds",
        "From the pod's Ready-drop time (kubelet clock, 1 s precision; a death heard on its node: "
        "the exit, to the microsecond) to Dead written",
        buckets=LATENCY_BUCKETS,
    )
    processing_latency: Histogram = histogram(
        "deathwatch_verdict_processing_seconds",
        "From the pod event received to the Dead verdict written (the controller's own share)",
        buckets=LATENCY_BUCKETS,
    )
    deaths: Counter = counter(
        "deathwatch_sandbox_deaths",
        "Sandboxes declared Dead, by node, cause and origin (Workload: its own doing; "
        "Infrastructure: a drain, preemption, taint eviction, node lost, deleted, shut down or "
        "pressed)",
        labels=("node", "cause", "origin"),
    )
    tracked: Gauge = gauge(
        "deathwatch_tracked_pods",
        "Tracked pods by verdict state",
        labels=("state",),
    )
    policy_errors: Counter = counter(
        "deathwatch_policy_errors",
        "judge() calls of a policy that raised, returned garbage or timed out",
        labels=("policy",),
    )


class NodeFamilies:
    """What the nodes said: exits heard, the firewall's coverage, Shielded."""

    node_exits: Counter = counter(
        "deathwatch_node_exits",
        "Container exits heard on the nodes (ADR 0028), by what came of them: judged (a verdict "
        "step), not-watched (no tracked sandbox's running container: another instance, an init "
        "container, another shard's pod), kubelet (only the kubelet can tell what it leads to, or "
        "the verdict was final already), gone (the pod was deleted), unread (the pod could not be "
        "read), busy (too many reads at once), settled (a standby's: the verdict was final when "
        "its deferred judgement came)",
        labels=("outcome",),
    )
    node_exit_delivery: Histogram = histogram(
        "deathwatch_node_exit_delivery_seconds",
        "From a container's exit (its node's clock) to the controller reading it on the node's "
        "exits Lease",
        buckets=LATENCY_BUCKETS,
    )
    node_exit_disputes: Counter = counter(
        "deathwatch_node_exit_disputes",
        "Deaths heard on the node that the kubelet's report told otherwise (the verdict stands; a "
        "NodeExitDisputed Event says how)",
        labels=("policy",),
    )
    kubelet_evictions: Counter = counter(
        "deathwatch_kubelet_evictions",
        "The kubelet's Evicted Events read for a tracked sandbox, before its kill (ADR 0044), by "
        "the cause they give a death: StorageLimitExceeded (its own limits), Evicted (node "
        "pressure)",
        labels=("cause",),
    )
    node_sandboxes: Gauge = gauge(
        "deathwatch_node_sandboxes",
        "Live sandboxes per node, by their Shielded status (True, False, Unknown; Audit: False "
        "because the node's firewall audits on purpose; none: no firewall configured)",
        labels=("node", "shielded"),
    )
    shielded: Gauge = gauge(
        "deathwatch_sandboxes_shielded",
        "Live sandboxes by their Shielded condition (True, False, Unknown): is the node firewall "
        "on their node current and covering them",
        labels=("status",),
    )
    unshielded_spells: Counter = counter(
        "deathwatch_sandbox_unshielded_spells",
        "Sandboxes that lost (or never had) a current node firewall, by reason",
        labels=("reason",),
    )
    coverage_nodes: Gauge = gauge(
        "deathwatch_firewall_coverage_nodes",
        "Nodes whose firewall agent publishes a coverage Lease (as last listed)",
    )


class ApiFamilies:
    """The API: writes, errors, and the watches that feed the controller."""

    write_backlog: Gauge = gauge(
        "deathwatch_write_backlog",
        "Objects waiting to be written (queued, in flight, backing off) or owed by a standby",
    )
    write_retries: Counter = counter(
        "deathwatch_write_retries",
        "Writes that failed and will be tried again after a backoff",
        labels=("resource",),
    )
    api_errors: Counter = counter(
        "deathwatch_api_errors",
        "Failed Kubernetes API calls",
        labels=("operation", "code"),
    )
    api_writes: Counter = counter(
        "deathwatch_api_writes",
        "Kubernetes API writes, by operation",
        labels=("operation",),
    )
    foreign_writes: Counter = counter(
        "deathwatch_foreign_writes",
        "Writes to deathwatch's objects seen while this replica led that were not its own (another "
        "term's write held up in the network and landing late, or a person)",
        labels=("resource",),
    )
    writes_refused: Counter = counter(
        "deathwatch_writes_refused",
        "Writes the API refused for good (a 4xx but conflicts): each status is logged once and not "
        "sent again until it changes",
        labels=("resource", "code"),
    )
    relists: Counter = counter(
        "deathwatch_watch_relists",
        "Watches that could not resume (410 Gone) and were followed by a new listing",
        labels=("resource",),
    )
    watch_connections: Counter = counter(
        "deathwatch_watch_connections",
        "Watch requests made per resource (one per server timeout, more after faults)",
        labels=("resource",),
    )
    watch_not_open: Gauge = gauge(
        "deathwatch_watch_not_open",
        "1 while a watched collection has not been listed within its deadline (30 s) of the "
        "reflector's start: start-up and readiness wait for it; /readyz names it",
        labels=("resource", "scope"),
    )
    watch_activity: Gauge = gauge(
        "deathwatch_watch_stream_activity_timestamp_seconds",
        "When a watch stream last delivered anything, bookmarks included (unix time)",
        labels=("resource",),
    )
    last_event: Gauge = gauge(
        "deathwatch_watch_last_event_timestamp_seconds",
        "When the last watch event of a resource arrived (unix time)",
        labels=("resource",),
    )


class ProcessFamilies:
    """The process: its tasks, pauses, leadership, other releases and its shard."""

    task_restarts: Counter = counter(
        "deathwatch_task_restarts",
        "Crashes of a supervised long-running task (each followed by a restart)",
        labels=("task",),
    )
    handler_errors: Counter = counter(
        "deathwatch_handler_errors",
        "Unexpected errors in a watch event handler (logged with traceback; event skipped)",
        labels=("handler",),
    )
    gc_pauses: Histogram = histogram(
        "deathwatch_gc_pause_seconds",
        "How long each garbage collection stopped the process, by generation (gcpauses.py)",
        labels=("generation",),
        buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
    )
    leader: Gauge = gauge(
        "deathwatch_leader",
        "1 while this replica holds the Lease and may write, else 0",
        labels=("identity",),
    )
    leader_transitions: Counter = counter(
        "deathwatch_leader_transitions",
        "This replica's leadership transitions, by what it became (leading, standby): a count "
        "that rises steadily is a Lease changing hands",
        labels=("to",),
    )
    release_collisions: Gauge = gauge(
        "deathwatch_release_collisions",
        "1 while another release shares what this one holds (what: controller-id, table, "
        "host-port; other: its NAMESPACE/RELEASE; yields: true when this release is the younger "
        "and gives way): the chart's install-time refusal, checked at runtime (ADR 0038)",
        labels=("what", "other", "yields"),
    )
    shard_owned_slots: Gauge = gauge(
        "deathwatch_shard_owned_slots",
        "Slots (of 64) this replica writes now: all of them for the leader of the only shard, its "
        "share for a shard's leader, 0 for a standby",
        labels=("shard",),
    )
    shard_filtered: Counter = counter(
        "deathwatch_shard_filtered",
        "Objects of another shard's slots dropped here (where: pods, verdicts, events: the "
        "kubelet's Evicted Events): no pods when the API server filters the pod watch "
        "(KEP-5866); all of them when it does not",
        labels=("where",),
    )
    shard_server_filtered: Gauge = gauge(
        "deathwatch_shard_server_filtered",
        "1 when the API server applied this shard's pod selector (it echoed it back), 0 when the "
        "filter runs here only",
    )


class DeliveryFamilies:
    """The events sent to the ends a platform configured (delivery/)."""

    delivery_events: Counter = counter(
        "deathwatch_delivery_events",
        "Events sent to an end, by sink and outcome: delivered (2xx), refused (a 4xx other than "
        "408 and 429: not sent again), expired (owed past the sink's maxAge)",
        labels=("sink", "outcome"),
    )
    delivery_retries: Counter = counter(
        "deathwatch_delivery_retries",
        "Attempts that will be made again, by sink and why (an HTTP status, connection, timeout, "
        "tls, keys)",
        labels=("sink", "reason"),
    )
    delivery_coalesced: Counter = counter(
        "deathwatch_delivery_coalesced",
        "Alive and Suspect events superseded by the sandbox's next transition before they could be "
        "delivered (Dead and Gone never are)",
        labels=("sink",),
    )
    delivery_backlog: Gauge = gauge(
        "deathwatch_delivery_backlog",
        "Sandboxes whose current transition a sink is owed (not delivered yet)",
        labels=("sink",),
    )
    delivery_oldest: Gauge = gauge(
        "deathwatch_delivery_oldest_undelivered_seconds",
        "Age of the oldest transition a sink is owed (0: none)",
        labels=("sink",),
    )
    delivery_unanswered: Gauge = gauge(
        "deathwatch_delivery_unanswered_attempts",
        "Attempts in a row that got no answer at all (refused connection, timeout, TLS): a "
        "receiver that is not there. 0 once one answers, even with a 429 or a 5xx",
        labels=("sink",),
    )
    delivery_latency: Histogram = histogram(
        "deathwatch_delivery_latency_seconds",
        "From the transition (the verdict's time) to the receiver's 2xx",
        labels=("sink",),
        buckets=LATENCY_BUCKETS,
    )
