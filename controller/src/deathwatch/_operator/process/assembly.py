"""The controller's parts, built once, each handed its collaborators, in the order they
depend on each other: the API clients, who leads, the writer, the memory and its passes, then
what feeds them (docs/architecture.md). Nothing here starts: startup.py does, in its order."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from deathwatch._api.kubeconfig import load_configuration
from deathwatch._api.rest import Rest
from deathwatch._kube.ports import Heartbeat
from deathwatch._operator.delivery.outbox import Deliveries
from deathwatch._operator.delivery.sender import Sender
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.instruments.supervisor import Supervisor
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.leadership.leader import Elector
from deathwatch._operator.leadership.owner import LeaseOwner
from deathwatch._operator.leadership.rivals import Rivals
from deathwatch._operator.memory.core import Core, Firewall
from deathwatch._operator.memory.coverage import Coverage
from deathwatch._operator.memory.deathwatches import DeathWatches
from deathwatch._operator.passes import publishing
from deathwatch._operator.passes.wiring import Passes
from deathwatch._operator.ports.endpoints import Endpoints
from deathwatch._operator.process.config import Config, version
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.shards.slot_leases import Ownership
from deathwatch._operator.shards.slots import slot_of
from deathwatch._operator.sources import exits as node_exits
from deathwatch._operator.sources.adoption import Adoption
from deathwatch._operator.sources.readiness import Readiness, Streams
from deathwatch._operator.sources.receivers import (
    AgentSandboxReceiver,
    DeathWatchReceiver,
    EvictionReceiver,
    Malformed,
    PodReceiver,
    VerdictReceiver,
)
from deathwatch._operator.sources.reflector import Collection, Reflector
from deathwatch._operator.sources.watched import Watched
from deathwatch._operator.writing.kube import ApiLease, ApiWrites
from deathwatch._operator.writing.writer import Writer
from deathwatch._policies import default_registry


class Parts:
    """Every part of one controller process, each built once. What the process keeps from
    before the build (its supervisor, the streams' freshness, the heartbeat, /readyz) is handed
    in; everything else is built here and never set again."""

    def __init__(self, config: Config, metrics: Metrics, *, supervisor: Supervisor,
                 readiness: Readiness, streams: Streams, heartbeat: Heartbeat,
                 readyz: Callable[[], tuple[bool, dict[str, Any]]]) -> None:  # fmt: skip
        self.config, self.metrics, self.supervisor = config, metrics, supervisor
        self.readiness, self.streams, self.heartbeat = readiness, streams, heartbeat
        self.readyz = readyz
        self.rests: list[Rest] = []
        self.elector: Elector | None = None
        self.lease_owner: LeaseOwner | None = None
        self.rivals: Rivals | None = None  # other releases sharing what this one holds
        self.sender: Sender | None = None
        self._configuration = load_configuration(config.kubeconfig)
        self._clients()
        self._leadership()
        self._writer()
        self._passes()
        self._sources()

    def _rest(self, purpose: str, connections: int) -> Rest:
        client = Rest(self._configuration, identity=self.config.identity, purpose=purpose,
                      connections=connections)  # fmt: skip
        self.rests.append(client)
        return client

    def _clients(self) -> None:
        """One client per purpose: a renewal never waits behind writes, a watch never holds
        a writer's connection, /readyz's probe never queues behind anything."""
        cfg = self.config
        self._writes = self._rest("writes", cfg.writers + 2)
        # the connections a death uses at once, kept warm between deaths (ADR 0034): its
        # verdict and its Event on the writes' pool, its pod read on the node exits' own
        self.warm_pools: list[tuple[Rest, int]] = [(self._writes, 2)]
        self.watched = Watched.of(cfg.scopes, cfg.shard, agent_sandbox=cfg.agent_sandbox,
                                  pod_label_selector=cfg.pod_label_selector,
                                  node_exits_namespace=cfg.node_exits_namespace)  # fmt: skip
        self.watches = self._rest("watches", self.watched.list_connections)
        self.probe = self._rest("probe", 2)
        self.endpoints = Endpoints(
            metrics_address=cfg.metrics_address, health_address=cfg.health_address,
            cert_dir=cfg.metrics_cert_dir, names=[cfg.identity, "localhost"],
            limits=cfg.port_limits, metrics=self.metrics, reviews=self._rest("reviews", 2),
            readiness=self.readyz, heartbeat=self.heartbeat,
        )  # fmt: skip

    def _leadership(self) -> None:
        """Who leads: one answer every part that writes asks (Leadership), the shard's slots,
        the other releases, and with election the Lease's elector."""
        cfg, metrics, shard = self.config, self.metrics, self.config.shard
        lease_name = shard.lease(cfg.lease_name)
        self.leadership = leadership = Leadership(metrics, cfg.identity, elected=cfg.leader_elect)
        self.ownership = ownership = Ownership(
            shard, lease_name, cfg.lease_namespace, metrics, cfg.lease_timings.retry_period,
            leadership,
        )  # fmt: skip
        if shard.sharded:
            leadership.sharded_by(ownership.owns)
        if cfg.lease_owner:
            # this replica's Deployment: what another release may share with it is checked at
            # runtime, as `lookup` does at install (ADR 0038), with or without election
            self.rivals = Rivals(self._rest("releases", 1), metrics, cfg.lease_namespace,
                                 cfg.lease_owner, cfg.firewall_daemonset,
                                 cfg.crds_release)  # fmt: skip
        if not cfg.leader_elect:
            return
        self.lease_rest = self._rest("lease", 2)
        lease = ApiLease(self.lease_rest, lease_name, cfg.lease_namespace,
                         cfg.lease_timings.renew_deadline / 2, cfg.identity)  # fmt: skip
        refusal: Callable[[], str | None] = _nothing_refused
        if cfg.lease_owner:
            self.lease_owner = LeaseOwner(self.lease_rest, cfg.lease_namespace,
                                          cfg.lease_owner, metrics)  # fmt: skip
        if self.rivals is not None:
            refusal = self.rivals.refusal
        self.elector = Elector(lease, cfg.identity, lease_name, cfg.lease_namespace,
                               metrics, cfg.lease_timings, leadership=leadership,
                               term_of=shard.term, claim=ownership.claim,
                               owner=self.lease_owner, refusal=refusal)  # fmt: skip

    def _writer(self) -> None:
        cfg, leadership, ownership = self.config, self.leadership, self.ownership
        # the only writer stamps its statuses with its start time: a new process is a new term
        term = 0 if cfg.leader_elect else time.time_ns() // 1_000_000
        self.writer = Writer(
            ApiWrites(self._writes, may_write=leadership.may_write, field_manager=cfg.identity),
            self.metrics, leadership=leadership, term=term,
        )  # fmt: skip
        ownership.on_give_up = self.writer.gave_up

    def _passes(self) -> None:
        """The memory (the Core), a pass per input over it, what publishes, what delivers;
        the followers of leadership, told in order."""
        cfg, metrics, ownership = self.config, self.metrics, self.ownership
        registry = default_registry()
        metrics.policies_known(registry.names)
        elector = self.elector
        coverage = (
            Coverage(cfg.coverage_interval, prefix=cfg.firewall_daemonset.rpartition("/")[2])
            if cfg.firewall_daemonset
            else None
        )
        deliveries = Deliveries(cfg.delivery)
        metrics.sinks_known(deliveries.sinks)
        self.core = core = Core(
            deathwatches=DeathWatches(registry, cfg.controller_id),
            firewall=Firewall(cfg.firewall_daemonset, coverage),
            shards=ShardFilter(cfg.shard, lambda: ownership.owned),
            rivals=self.rivals,
        )
        self.passes = passes = Passes(core, writer=self.writer, metrics=metrics,
                                      policies=registry, deliveries=deliveries)  # fmt: skip
        self.liveness = publishing.Liveness(
            fresh=self.streams.fresh,
            stale_after=cfg.stream_stale_after,
            leader=(lambda: elector.leader) if elector else (lambda: cfg.identity),
        )
        if deliveries:
            self.sender = Sender(deliveries, passes.bridge.compose, passes.bridge.delivered,
                                 metrics, leadership=self.leadership,
                                 user_agent=f"deathwatch/{version()}", clock=passes.clock,
                                 sendable=(lambda uid: self.leadership.writes(slot_of(uid)))
                                 if cfg.shard.sharded else None)  # fmt: skip
        ownership.on_gain = passes.takeover.gained
        self.leadership.follow(ownership, passes.takeover,
                               *([self.sender] if self.sender else []))  # fmt: skip

    def _sources(self) -> None:
        """What feeds the passes: adoption, and a reflector per watched collection, each
        with its receiver."""
        cfg, metrics, passes, core = self.config, self.metrics, self.passes, self.core
        plan = self.watched
        self.adoption = Adoption(self.watches, passes.pods, core.deathwatches, metrics,
                                 cfg.pod_label_selector, plan.pods_by_slot)  # fmt: skip
        s, malformed = self.streams, Malformed()

        def reflector(collection: Collection[Any], receiver: Any) -> Reflector[Any]:
            return Reflector(self.watches, collection, receiver, metrics,
                             open_deadline=cfg.watch_open_deadline)  # fmt: skip

        # a receiver per collection: each listing's own state (restoring, what it saw)
        verdicts = passes.verdicts, malformed, metrics
        s.verdicts.extend(reflector(x, VerdictReceiver(*verdicts)) for x in plan.verdicts)
        # a receiver each: each scope's listing says which of its DeathWatches are gone
        self.deathwatch_receivers = [DeathWatchReceiver(passes.owners, malformed, metrics)
                                     for _ in plan.deathwatches]  # fmt: skip
        pairs = zip(plan.deathwatches, self.deathwatch_receivers, strict=True)
        s.deathwatches.extend(reflector(x, receiver) for x, receiver in pairs)
        boxes = passes.owners, malformed, metrics
        s.agent_sandboxes.extend(reflector(x, AgentSandboxReceiver(*boxes)) for x in plan.sandboxes)
        s.pods.extend(reflector(x, PodReceiver(passes.pods, malformed, metrics)) for x in plan.pods)
        evictions = EvictionReceiver(passes.pods, malformed, metrics)
        s.evictions.extend(reflector(x, evictions) for x in plan.evictions)
        if plan.node_exits:
            # its own client: a pod read for an exit never queues behind a listing or a write
            exits_rest = self._rest("node-exits", 4)
            self.warm_pools.append((exits_rest, 1))
            heard = node_exits.NodeExits(passes.node_exits, core.records, core.shards,
                                         self.leadership, exits_rest, metrics,
                                         self.supervisor, malformed)  # fmt: skip
            s.node_exits.extend(reflector(x, heard) for x in plan.node_exits)


def _nothing_refused() -> str | None:
    return None
