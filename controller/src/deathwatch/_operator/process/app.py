"""Wiring: the controller's parts built once, each handed its collaborators; the start-up
order; shutdown. Nothing else: the work is in the parts (docs/architecture.md).

Start-up, in order, so that no pod is judged before the engine's memory and the DeathWatches
are in place: the SandboxVerdicts are listed (the engine's memory restored from them), the
DeathWatches are listed, agent-sandbox's Sandboxes (at most SANDBOXES_WAIT), then the pods;
only then do the writers and the loops start. kopf keeps the process's life (login, start-up,
clean-up: lifecycle.py); pods, verdicts, DeathWatches and Sandboxes come through our own reflectors
(reflector.py, ADR 0014). DeathWatches were kopf's until #43: most of their events are the
controller's own status writes, which every process receives, and kopf's handler cost each a
whole decode and a handler call; ours reads their metadata and, when only the status moved,
just what this process needs of it (watched.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import structlog

from deathwatch._api.kubeconfig import load_configuration
from deathwatch._api.rest import Rest
from deathwatch._engine.timeutil import parse_time
from deathwatch._kube.errors import describe, label
from deathwatch._kube.ports import Heartbeat
from deathwatch._operator.delivery.outbox import Deliveries
from deathwatch._operator.delivery.sender import Sender
from deathwatch._operator.instruments import gcpauses
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.instruments.supervisor import Supervisor
from deathwatch._operator.leadership.group import Leadership
from deathwatch._operator.leadership.leader import Elector
from deathwatch._operator.leadership.owner import LeaseOwner
from deathwatch._operator.leadership.rivals import Rivals, heed, keep_off
from deathwatch._operator.memory.core import Core, Firewall
from deathwatch._operator.memory.coverage import Coverage
from deathwatch._operator.memory.deathwatches import DeathWatches, Revised
from deathwatch._operator.passes import publishing
from deathwatch._operator.passes.wiring import Passes
from deathwatch._operator.ports.endpoints import Endpoints
from deathwatch._operator.process import timers
from deathwatch._operator.process.config import Config, version
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.shards.slot_leases import Ownership
from deathwatch._operator.shards.slots import slot_of
from deathwatch._operator.sources import exits as node_exits
from deathwatch._operator.sources import readiness, reads
from deathwatch._operator.sources.adoption import Adoption
from deathwatch._operator.sources.readiness import Readiness, Streams
from deathwatch._operator.sources.receivers import (
    AgentSandboxReceiver,
    DeathWatchReceiver,
    Malformed,
    PodReceiver,
    VerdictReceiver,
)
from deathwatch._operator.sources.reflector import Collection, Reflector
from deathwatch._operator.sources.watched import Watched
from deathwatch._operator.writing.kube import ApiLease, ApiWrites
from deathwatch._operator.writing.writer import Writer
from deathwatch._policies import default_registry

log = structlog.get_logger("deathwatch.app")

SANDBOXES_WAIT = 30.0  # seconds start-up waits for the Sandboxes' first listing, at most


class App:
    def __init__(self, config: Config, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.supervisor = Supervisor(self.metrics)
        self.readiness = Readiness()
        self.streams = Streams(config.stream_stale_after)
        self.heartbeat = Heartbeat(file=config.heartbeat_file)
        self.built = False
        self.started = False
        self.endpoints: Endpoints | None = None
        self.listening = False
        self.gc_pauses: gcpauses.PauseLog | None = None
        self.elector: Elector | None = None
        self.lease_owner: LeaseOwner | None = None
        self.rivals: Rivals | None = None  # other releases sharing what this one holds
        self.rests: list[Rest] = []
        self.sender: Sender | None = None

    # --- construction: every part once, handed to the next -----------------------------

    def build(self) -> None:
        """Every part once, each handed its collaborators, in the order they depend on each
        other: the API clients, who leads, the writer, the memory and its passes, then what
        feeds them."""
        self.gc_pauses = gcpauses.install(self.metrics)
        self._configuration = load_configuration(self.config.kubeconfig)
        self._clients()
        self._leadership()
        self._writer()
        self._passes()
        self._sources()
        self.built = True

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
        if plan.node_exits:
            # its own client: a pod read for an exit never queues behind a listing or a write
            exits_rest = self._rest("node-exits", 4)
            self.warm_pools.append((exits_rest, 1))
            heard = node_exits.NodeExits(passes.node_exits, core.records, core.shards,
                                         self.leadership, exits_rest, metrics,
                                         self.supervisor, malformed)  # fmt: skip
            s.node_exits.extend(reflector(x, heard) for x in plan.node_exits)

    # --- start-up and shutdown -------------------------------------------------------------

    async def start(self) -> None:
        """kopf's start-up handler: returns once verdicts, DeathWatches and pods are listed.
        A failing list is retried by its reflector (counted, logged); /healthz answers
        meanwhile. In order: the ports, the listings, the writers, the election, the timed
        loops."""
        if not self.built:
            self.build()
        await self._listen()
        if self.started:
            return
        await self.learn_epoch()  # raises if it cannot: kopf retries the start-up, logged
        self.started = True
        await self._list_all()
        await self._begin_writing()
        await self._begin_election()
        self._start_timers()
        log.info("started", tracked=len(self.core.records),
                 namespaces=list(self.config.namespaces) or "all")  # fmt: skip

    async def _listen(self) -> None:
        """The ports and the heartbeat, once, before anything is listed."""
        cfg, sup = self.config, self.supervisor
        if not self.listening and self.endpoints is not None:
            await self.endpoints.start()
            self.listening = True
            sup.start("heartbeat", lambda: self.heartbeat.beating(self._pulse))
            if cfg.metrics_cert_dir is not None:
                sup.start("certificates", self.endpoints.certificates)

    async def _list_all(self) -> None:
        """Every watch, each waited for in the order the next needs it: the verdicts (memory
        restored), the DeathWatches (each finds its own pods), agent-sandbox's Sandboxes (at
        most SANDBOXES_WAIT), the pods; then the node exits, which need the records."""
        s, sup = self.streams, self.supervisor
        for i, reflector in enumerate(s.verdicts):
            sup.start(f"watch-verdicts-{i}", reflector.run)
        await asyncio.gather(*(r.listed() for r in s.verdicts))
        for i, reflector in enumerate(s.deathwatches):  # before the pods: each finds its own
            sup.start(f"watch-deathwatches-{i}", reflector.run)
        await asyncio.gather(*(r.listed() for r in s.deathwatches))
        for receiver in self.deathwatch_receivers:  # a selection new from now: its pods listed
            receiver.adopt = self._adopt
        for i, reflector in enumerate(s.agent_sandboxes):
            sup.start(f"watch-sandboxes-{i}", reflector.run)
        try:
            # Sandboxes before pods, so the first verdicts already name their claims; never
            # held up by them: a Sandbox watch that cannot list (RBAC) is retried, and logged
            async with asyncio.timeout(SANDBOXES_WAIT):
                await asyncio.gather(*(r.settled() for r in s.agent_sandboxes))
        except TimeoutError:
            log.warning("agent-sandbox Sandboxes not listed yet: starting without them",
                        waited=SANDBOXES_WAIT)  # fmt: skip
        for i, reflector in enumerate(s.pods):
            sup.start(f"watch-pods-{i}", reflector.run)
        await asyncio.gather(*(r.listed() for r in s.pods))
        for i, reflector in enumerate(s.node_exits):  # after the pods: exits need records
            sup.start(f"watch-node-exits-{i}", reflector.run)

    async def _begin_writing(self) -> None:
        """The writers and the sender; without election, the only writer leads from here
        (if no older release serves its DeathWatches)."""
        cfg, sup = self.config, self.supervisor
        if self.elector is None and self.rivals is not None:
            # the only writer, without an elector to ask: it leads only if no older release
            # serves its DeathWatches (keep_off asks again from here on)
            await self._first_rivals(self.rivals)
            heed(self.rivals, self.leadership)
        self.leadership.begin()  # the only writer: it leads from here (else the elector says)
        if self.sender is not None:
            sender = self.sender
            for name in sender.deliveries.sinks:
                sup.start(f"deliver-{name}", functools.partial(sender.run, name))
        for i in range(cfg.writers):
            sup.start(f"writer-{i}", self.writer.work)
        pools = self.warm_pools
        sup.start("warm-connections", lambda: timers.warm(pools, self.metrics))

    async def _begin_election(self) -> None:
        """The Lease's owner and the other releases read before the first election; then the
        election, the Lease's watch, the shard's slots, and the releases checked for ever."""
        cfg, sup = self.config, self.supervisor
        if self.elector is not None:
            if self.lease_owner is not None:
                await self.lease_owner.learn()  # bounded; a failure is said, not fatal
            if self.rivals is not None:  # before the first election (without one: _begin_writing)
                await self._first_rivals(self.rivals)
        if self.rivals is not None:
            rivals, every, leadership = self.rivals, cfg.release_check_interval, self.leadership
            sup.start("releases", lambda: rivals.run(every))
            if self.elector is None:
                sup.start("releases-keep-off", lambda: keep_off(rivals, leadership))
        if self.elector is not None:
            sup.start("leader-election", self.elector.run)
            sup.start("lease-watch", self.elector.watch)
            if cfg.shard.sharded:
                rest_ = self.lease_rest
                sup.start("shard-slots", lambda: self.ownership.run(rest_))

    def _start_timers(self) -> None:
        """The clock's loops: Suspect deadlines, publishing and retention, the API probe,
        the firewall's coverage."""
        cfg, sup = self.config, self.supervisor
        p, m, probe, fw = self.passes, self.metrics, self.probe, cfg.firewall_daemonset
        sup.start("deadlines", lambda: timers.suspects(p.pods, self.core.wake))
        sup.start("publish", lambda: timers.publishing(
            p.status, p.retention, p.shielding, self.liveness, cfg.publish_interval,
            cfg.retire_interval))  # fmt: skip
        firewall = self.core.firewall
        sup.start("probe", lambda: reads.probe(firewall, probe, m, self.readiness, fw,
                                               cfg.probe_interval))  # fmt: skip
        if fw:
            namespace = fw.split("/", 1)[0]
            sup.start(
                "firewall-coverage",
                lambda: reads.coverage(p.shielding, probe, m, namespace, cfg.coverage_interval),
            )

    async def _first_rivals(self, rivals: Rivals) -> None:
        """Before the first election: what another release shares with this one, so a
        controller that must give way never leads, not even once. Bounded; a failure is
        said (log, metric) and the check goes on in its task."""
        try:
            await asyncio.wait_for(rivals.check(), 30)
        except Exception as exc:
            rivals.error = describe(exc)[:300]
            self.metrics.api_errors.labels("list_releases", label(exc)).inc()
            log.warning("cannot read the other releases before the election: collisions with "
                        "them are checked once they can be read", error=rivals.error)  # fmt: skip

    async def learn_epoch(self) -> None:
        """--shard-epoch=pod:NAMESPACE/NAME: the shard's epoch is that pod's creation, in
        seconds, on the API server's clock. A reshard's pods are created after the pods they
        replace, however the chart was rendered (`helm template` has no revision to give), so
        the newer configuration's shards are the newer epoch (ADR 0025, #53)."""
        if self.config.shard_epoch_pod is None:
            return
        namespace, name = self.config.shard_epoch_pod
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            pod = await asyncio.wait_for(self.probe.get(path), 30)
            created = parse_time(pod["metadata"]["creationTimestamp"])
        except Exception as exc:
            log.error("cannot read this replica's pod for its shard epoch; start-up is tried "
                      "again", pod=f"{namespace}/{name}", error=describe(exc)[:300])  # fmt: skip
            raise
        if created is None:
            raise ValueError(f"pod {namespace}/{name}: no creationTimestamp")
        spec = dataclasses.replace(self.ownership.spec, epoch=int(created.timestamp()))
        self.ownership.spec = self.core.shards.spec = spec  # before the first claim is written
        log.info("shard epoch: this replica's pod's creation", epoch=spec.epoch,
                 pod=f"{namespace}/{name}", shard=f"{spec.index}/{spec.count}")  # fmt: skip

    async def stop(self) -> None:
        """SIGTERM: a leader finishes what it decided (bounded), stops writing, then releases
        the Lease so a standby takes over at its next try instead of after the lease runs out."""
        if self.sender is not None:
            await self.sender.close()  # what is in flight stays owed: the next leader sends it
        if self.built and self.leadership.leading:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.writer.idle(), 10)
            self.leadership.standby("shutting down: stopped writing")
        if self.elector is not None:
            # the election ends first: a renewal sent after the release would take the Lease
            # back (seen: a release's PUT refused 409, the loop's renewal 21 ms later taken)
            await self.supervisor.cancel("leader-election", "lease-watch", "shard-slots")
            await self.elector.release()
        await self.supervisor.stop()
        if self.gc_pauses is not None:
            gcpauses.uninstall(self.gc_pauses)
        if self.endpoints is not None and self.listening:
            await self.endpoints.stop()
        for client in self.rests:
            await client.close()

    def _adopt(self, change: Revised) -> None:
        """A DeathWatch new or selecting differently: its namespace's pods listed (bounded
        retries, every failure logged: adoption.py), beside the watches."""
        failed = "a deathwatch's pods not adopted; each pod's next event adopts it"
        self.supervisor.spawn("adopt", self.adoption.adopt(change), failed)

    def _pulse(self) -> tuple[tuple[str, ...], bool]:
        """What the health port says, once a second: the tasks that keep crashing, and
        whether the controller is ready."""
        failing = tuple(f"{n}: {e}"[:200] for n, e in self.supervisor.failing().items())
        return failing, self.readyz()[0]

    def _releases(self) -> dict[str, Any] | None:
        """What another release shares with this one (ADR 0038); None: not checked."""
        if self.rivals is None:
            return None
        return {"refused": self.rivals.refusal(), "collisions": self.rivals.messages(),
                "read": self.rivals.read, "error": self.rivals.error}  # fmt: skip

    def _shard_status(self) -> dict[str, Any]:
        if not self.config.shard.sharded:
            return {}
        filtered = [r.server_filtered for r in self.streams.pods]
        return {"shard": {**self.ownership.status(), "server_filtered": filtered}}

    def readyz(self) -> tuple[bool, dict[str, Any]]:
        """/readyz, from what the parts keep (readiness.py)."""
        built = self.built

        def parts() -> dict[str, Any]:
            c = self.core if built else None
            return {
                "firewall": c.firewall.reading if c else None,
                "task_restarts": {n: t.restarts for n, t in self.supervisor.tasks.items()},
                "failing_tasks": self.supervisor.failing(),
                "pods_with_failing_policy": c.records.failing if c else 0,
                "leader": self.elector.status() if self.elector else {"leader_election": "off"},
                "releases": self._releases(),
                **self._shard_status(),
                "tracked": len(c.records) if c else 0,
                "write_backlog": self.writer.backlog if built else 0,
            }

        return readiness.report(self.readiness, self.streams, parts)


def _nothing_refused() -> str | None:
    return None
