"""Wiring: the controller's parts built once, each handed its collaborators; the start-up
order; kopf's handlers. Nothing else: the work is in the parts (docs/architecture.md).

Start-up, in order, so that no pod is judged before the engine's memory and the DeathWatches
are in place: the SandboxVerdicts are listed (the engine's memory restored from them), the
DeathWatches are listed, agent-sandbox's Sandboxes (at most SANDBOXES_WAIT), then the pods;
only then do the writers and the loops start. kopf keeps the process's life (login, start-up,
clean-up); pods, verdicts, DeathWatches and Sandboxes come through our own reflectors
(reflector.py, ADR 0014). DeathWatches were kopf's until #43: most of their events are the
controller's own status writes, which every process receives, and kopf's handler cost each a
whole decode and a handler call; ours reads their metadata and, when only the status moved,
just what this process needs of it (watched.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import structlog

from deathwatch._api.kubeconfig import load_configuration
from deathwatch._api.rest import Rest
from deathwatch._kube.ports import Heartbeat
from deathwatch._kube.serving import Limits
from deathwatch._operator.delivery.config import DeliveryConfig
from deathwatch._operator.delivery.outbox import Deliveries
from deathwatch._operator.delivery.sender import Sender
from deathwatch._operator.instruments import gcpauses
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.instruments.supervisor import Supervisor
from deathwatch._operator.judging.summary import Summaries
from deathwatch._operator.leadership.leader import Elector, LeaseTimings
from deathwatch._operator.memory.agent_sandboxes import AgentSandboxes
from deathwatch._operator.memory.core import Core, Firewall
from deathwatch._operator.memory.coverage import Coverage
from deathwatch._operator.memory.deathwatches import Change, DeathWatches
from deathwatch._operator.memory.records import Records
from deathwatch._operator.passes import delivery_bridge, publishing, verdict_watch
from deathwatch._operator.ports.endpoints import Address, Endpoints
from deathwatch._operator.process import timers
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.shards.slot_claims import Spec
from deathwatch._operator.shards.slot_leases import Ownership
from deathwatch._operator.shards.slots import slot_of
from deathwatch._operator.sources import exits as node_exits
from deathwatch._operator.sources import readiness, reads
from deathwatch._operator.sources.adoption import Adoption
from deathwatch._operator.sources.readiness import Readiness, Streams
from deathwatch._operator.sources.reflector import OPEN_DEADLINE, Collection, Reflector
from deathwatch._operator.sources.sinks import (
    AgentSandboxSink,
    DeathWatchSink,
    PodSink,
    VerdictSink,
)
from deathwatch._operator.sources.watched import Watched
from deathwatch._operator.writing.kube import ApiLease, ApiWrites
from deathwatch._operator.writing.writer import Writer
from deathwatch._policies import default_registry

log = structlog.get_logger("deathwatch.app")

STALE_AFTER = 90.0  # a watch with nothing (not even a bookmark) for this long is stale
SANDBOXES_WAIT = 30.0  # seconds start-up waits for the Sandboxes' first listing, at most


@dataclass(frozen=True)
class Config:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    kubeconfig: str | None = None
    metrics_address: Address = ("0.0.0.0", 8443)  # noqa: S104 - HTTPS, /metrics authorized
    health_address: Address = ("0.0.0.0", 8081)  # noqa: S104 - HTTP, the kubelet's probes
    heartbeat_file: Path | None = None  # the exec liveness probe's (written every beat)
    metrics_cert_dir: Path | None = None  # tls.crt and tls.key (cert-manager); None: self-signed
    port_limits: Limits = field(default_factory=Limits)  # what a client may hold of a port
    firewall_daemonset: str | None = None  # "namespace/name"
    pod_label_selector: str | None = None  # optional server-side prefilter of watched pods
    controller_id: str = ""  # serves the DeathWatches annotated with it (ADR 0029)
    agent_sandbox: bool = True  # watch agent-sandbox's Sandboxes (if and once installed)
    probe_interval: float = 15.0  # /readyz and the firewall DaemonSet: one light call each
    coverage_interval: float = 5.0  # the firewall agents' coverage Leases: one list each
    publish_interval: float = 1.0  # DeathWatch status, at most once per interval
    stream_stale_after: float = STALE_AFTER
    watch_open_deadline: float = OPEN_DEADLINE  # a collection not listed by then is named
    retire_interval: float = 10.0  # how often verdicts past their retention are looked for
    writers: int = 8
    leader_elect: bool = True  # False: this process is the only writer (one replica)
    identity: str = "deathwatch"  # the pod's name: on the Lease, and as field manager
    lease_name: str = "deathwatch-controller"
    lease_namespace: str = "deathwatch-system"
    lease_timings: LeaseTimings = field(default_factory=LeaseTimings)
    delivery: DeliveryConfig | None = None  # the sinks verdicts are delivered to (delivery/)
    shard: Spec = field(default_factory=Spec)  # which slots this process judges (ADR 0025)
    # where the node agents' exits Leases are (ADR 0028: deaths heard on the node); None: off
    node_exits_namespace: str | None = None

    @property
    def scopes(self) -> tuple[str | None, ...]:
        """What each reflector lists and watches: one namespace each, or everything."""
        return self.namespaces or (None,)


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
        self.rests: list[Rest] = []
        self.sender: Sender | None = None

    # --- construction: every part once, handed to the next -----------------------------

    def build(self) -> None:
        cfg, metrics = self.config, self.metrics
        self.gc_pauses = gcpauses.install(metrics)
        configuration = load_configuration(cfg.kubeconfig)

        def rest(purpose: str, connections: int) -> Rest:
            client = Rest(configuration, identity=cfg.identity, purpose=purpose,
                          connections=connections)  # fmt: skip
            self.rests.append(client)
            return client

        # one client per purpose: a renewal never waits behind writes, a watch never holds a
        # writer's connection, /readyz's probe never queues behind anything
        writes = rest("writes", cfg.writers + 2)
        self.watched = Watched.of(cfg.scopes, cfg.shard, agent_sandbox=cfg.agent_sandbox,
                                  pod_label_selector=cfg.pod_label_selector,
                                  node_exits_namespace=cfg.node_exits_namespace)  # fmt: skip
        self.watches = rest("watches", self.watched.list_connections)
        self.probe = rest("probe", 2)
        self.endpoints = Endpoints(
            metrics_address=cfg.metrics_address, health_address=cfg.health_address,
            cert_dir=cfg.metrics_cert_dir, names=[cfg.identity, "localhost"],
            limits=cfg.port_limits, metrics=metrics, reviews=rest("reviews", 2),
            readiness=self.readyz, heartbeat=self.heartbeat,
        )  # fmt: skip
        may_write: Callable[[], bool] = lambda: True  # noqa: E731 - the only writer
        shard = cfg.shard
        lease_name = shard.lease(cfg.lease_name)
        self.ownership = Ownership(shard, lease_name, cfg.lease_namespace, metrics,
                                   cfg.lease_timings.retry_period)  # fmt: skip
        if cfg.leader_elect:
            self.lease_rest = rest("lease", 2)
            lease = ApiLease(self.lease_rest, lease_name, cfg.lease_namespace,
                             cfg.lease_timings.renew_deadline / 2, cfg.identity)  # fmt: skip
            self.elector = Elector(lease, cfg.identity, lease_name, cfg.lease_namespace,
                                   metrics, cfg.lease_timings, on_change=self._leading,
                                   claim=self.ownership.claim)  # fmt: skip
            may_write = self.elector.may_write
        # the only writer stamps its statuses with its start time: a new process is a new term
        term = 0 if cfg.leader_elect else time.time_ns() // 1_000_000
        ownership = self.ownership
        self.writer = Writer(
            ApiWrites(writes, may_write=may_write, field_manager=cfg.identity),
            metrics, may_write=may_write, leading=not cfg.leader_elect, term=term,
            owns=ownership.owns if shard.sharded else _everything,
        )  # fmt: skip
        ownership.on_gain = self._gained
        ownership.on_give_up = self.writer.gave_up
        if not cfg.leader_elect:
            ownership.lead()
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
        self.core = Core(
            deathwatches=DeathWatches(registry, cfg.controller_id),
            records=Records(),
            policies=registry,
            summaries=Summaries(),
            writer=self.writer,
            metrics=metrics,
            firewall=Firewall(cfg.firewall_daemonset, coverage),
            agent_sandboxes=AgentSandboxes(),
            deliveries=deliveries,
            shards=ShardFilter(shard, lambda: ownership.owned),
        )
        self.liveness = publishing.Liveness(
            fresh=self.streams.fresh,
            stale_after=cfg.stream_stale_after,
            leader=(lambda: elector.leader) if elector else (lambda: cfg.identity),
        )
        core = self.core
        if deliveries:
            self.sender = Sender(deliveries, lambda uid, sink, owed: delivery_bridge.compose(
                                     core, uid, sink, owed),
                                 lambda ended: delivery_bridge.delivered(core, ended),
                                 metrics, may_send=may_write, user_agent=f"deathwatch/{_version()}",
                                 clock=core.clock,
                                 sendable=(lambda uid: ownership.owns(slot_of(uid)))
                                 if shard.sharded else None)  # fmt: skip
        plan = self.watched
        self.adoption = Adoption(self.watches, self.core, metrics, cfg.pod_label_selector,
                                 plan.pods_by_slot)  # fmt: skip
        c, w, s = self.core, self.writer, self.streams

        def reflector(collection: Collection[Any], sink: Any) -> Reflector[Any]:
            return Reflector(self.watches, collection, sink, metrics,
                             open_deadline=cfg.watch_open_deadline)  # fmt: skip

        s.verdicts.extend(reflector(x, VerdictSink(c, w, metrics)) for x in plan.verdicts)
        # a sink each: each scope's listing says which of its DeathWatches are gone
        self.deathwatch_sinks = [DeathWatchSink(c, metrics) for _ in plan.deathwatches]
        pairs = zip(plan.deathwatches, self.deathwatch_sinks, strict=True)
        s.deathwatches.extend(reflector(x, sink) for x, sink in pairs)
        s.agent_sandboxes.extend(reflector(x, AgentSandboxSink(c, metrics)) for x in plan.sandboxes)
        s.pods.extend(reflector(x, PodSink(c, metrics)) for x in plan.pods)
        if plan.node_exits:
            # its own client: a pod read for an exit never queues behind a listing or a write
            heard = node_exits.NodeExits(c, rest("node-exits", 4), metrics, self.supervisor)
            s.node_exits.extend(reflector(x, heard) for x in plan.node_exits)
        self.built = True

    # --- start-up and shutdown -------------------------------------------------------------

    async def start(self, settings: kopf.OperatorSettings) -> None:
        """kopf's start-up handler: returns once verdicts, DeathWatches and pods are listed.
        A failing list is retried by its reflector (counted, logged); /healthz answers
        meanwhile."""
        configure_kopf(settings, self.config)
        if not self.built:
            self.build()
        cfg, s, sup = self.config, self.streams, self.supervisor
        if not self.listening and self.endpoints is not None:
            await self.endpoints.start()
            self.listening = True
            sup.start("heartbeat", lambda: self.heartbeat.beating(self._pulse))
            if cfg.metrics_cert_dir is not None:
                sup.start("certificates", self.endpoints.certificates)
        if self.started:
            return
        self.started = True
        for i, reflector in enumerate(s.verdicts):
            sup.start(f"watch-verdicts-{i}", reflector.run)
        await asyncio.gather(*(r.listed() for r in s.verdicts))
        for i, reflector in enumerate(s.deathwatches):  # before the pods: each finds its own
            sup.start(f"watch-deathwatches-{i}", reflector.run)
        await asyncio.gather(*(r.listed() for r in s.deathwatches))
        for sink in self.deathwatch_sinks:  # a selection new from now: its pods listed
            sink.adopt = self._adopt
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
        if self.elector is None:  # the only writer: it leads from the start
            self.reconcile_events()
            if self.sender is not None:
                self.sender.lead()
        if self.sender is not None:
            sender = self.sender
            for name in sender.deliveries.sinks:
                sup.start(f"deliver-{name}", functools.partial(sender.run, name))
        for i in range(cfg.writers):
            sup.start(f"writer-{i}", self.writer.work)
        if self.elector is not None:
            sup.start("leader-election", self.elector.run)
            sup.start("lease-watch", self.elector.watch)
            if cfg.shard.sharded:
                rest_ = self.lease_rest
                sup.start("shard-slots", lambda: self.ownership.run(rest_))
        c, m, probe, fw = self.core, self.metrics, self.probe, cfg.firewall_daemonset
        sup.start("deadlines", lambda: timers.suspects(c))
        sup.start(
            "publish",
            lambda: timers.publishing(c, self.liveness, cfg.publish_interval, cfg.retire_interval),
        )
        sup.start("probe", lambda: reads.probe(c, probe, m, self.readiness, fw, cfg.probe_interval))
        if fw:
            namespace = fw.split("/", 1)[0]
            sup.start(
                "firewall-coverage",
                lambda: reads.coverage(c, probe, m, namespace, cfg.coverage_interval),
            )
        log.info("started", tracked=len(c.records), namespaces=list(cfg.namespaces) or "all")

    async def stop(self) -> None:
        """SIGTERM: a leader finishes what it decided (bounded), stops writing, then releases
        the Lease so a standby takes over at its next try instead of after the lease runs out."""
        if self.sender is not None:
            await self.sender.close()  # what is in flight stays owed: the next leader sends it
        if self.built and self.writer.leading:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.writer.idle(), 10)
            self.writer.standby()
        if self.elector is not None:
            await self.elector.release()
        await self.supervisor.stop()
        if self.gc_pauses is not None:
            gcpauses.uninstall(self.gc_pauses)
        if self.endpoints is not None and self.listening:
            await self.endpoints.stop()
        for client in self.rests:
            await client.close()

    def _adopt(self, change: Change) -> None:
        """A DeathWatch new or selecting differently: its namespace's pods listed (bounded
        retries, every failure logged: adoption.py), beside the watches."""
        failed = "a deathwatch's pods not adopted; each pod's next event adopts it"
        self.supervisor.spawn("adopt", self.adoption.adopt(change), failed)

    def _leading(self, leading: bool) -> None:
        """The elector's verdict: write (what this replica owes first), or stand by."""
        if not leading:
            self.ownership.standby()
            if self.sender is not None:
                self.sender.standby()
            self.writer.standby()
            return
        self.ownership.lead()
        self.reconcile_events()
        term = self.elector.term if self.elector else None
        if term is not None and self.config.shard.sharded:
            term = term * 64 + self.config.shard.index  # unique across the shards' Leases
        owed = self.writer.lead(term)
        verdict_watch.republish(self.core, owed)
        if self.sender is not None:
            self.sender.lead()  # what the old leader left undelivered, then what comes

    def _gained(self, slots: frozenset[int]) -> None:
        """Sharded: these slots are this shard's to write from now on: what it owes there is
        said again, and their deliveries may go."""
        verdict_watch.republish(self.core, self.writer.gained(slots))
        if self.sender is not None:
            self.sender.wake.set()

    def reconcile_events(self) -> None:
        """Taking over the writing: post again any SandboxDead Event a crash may have lost."""
        events = publishing.unannounced_deaths(self.core)
        if events:
            log.info("reconciling sandboxdead events", count=len(events))
            self.writer.reconcile(events)

    def _pulse(self) -> tuple[tuple[str, ...], bool]:
        """What the health port says, once a second: the tasks that keep crashing, and
        whether the controller is ready."""
        failing = tuple(f"{n}: {e}"[:200] for n, e in self.supervisor.failing().items())
        return failing, self.readyz()[0]

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
                **self._shard_status(),
                "tracked": len(c.records) if c else 0,
                "write_backlog": self.writer.backlog if built else 0,
            }

        return readiness.report(self.readiness, self.streams, parts)


def _everything(slot: int | None) -> bool:
    return True  # one shard writes every slot


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deathwatch")
    except PackageNotFoundError:
        return "unknown"


def configure_kopf(settings: kopf.OperatorSettings, config: Config) -> None:
    settings.posting.enabled = False  # our Events are posted by the writer, once each
    settings.peering.standalone = True  # no kopf peering: the Lease elects the writer (ADR 0011)
    settings.scanning.disabled = True  # kopf watches nothing: every watch is a reflector
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10


def register(registry: kopf.OperatorRegistry, app: App) -> None:
    """Attach the handlers to a kopf registry. Small and declarative: the work is elsewhere."""

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same as our own client (kube.load_configuration): --kubeconfig if given, else
        # in a pod the Service address from the environment, as client-go does (kopf's own
        # service-account login asks DNS for kubernetes.default.svc; no DNS, no controller).
        if app.config.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return kopf.login_via_client(**kwargs)
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(id="startup", registry=registry, backoff=2)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        await app.start(settings)

    @kopf.on.cleanup(id="cleanup", registry=registry)
    async def cleanup(**_: Any) -> None:
        await app.stop()
