"""Wiring: the controller's parts built once and handed to each other, the reflectors, the
loops (each supervised), the HTTP endpoints, and kopf's handlers.

Start-up, in order, so that no pod is judged before the engine's memory and the DeathWatches
are in place: the SandboxVerdicts are listed (the engine's memory restored from them), the
DeathWatches are listed, then the pods; only then do kopf's DeathWatch watch and the other
loops start. kopf keeps the DeathWatches (few objects, edited by people: its handler with
retries is worth more there) and the process's life (login, start-up, clean-up); pods and
verdicts come through our own reflector (reflector.py, ADR 0014).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kopf
import msgspec
import structlog

from deathwatch._engine.fleet import Fleet
from deathwatch._engine.podview import MalformedPod, PodView, decode_pod
from deathwatch._engine.timeutil import UTC
from deathwatch._operator import gcpauses
from deathwatch._operator.agent_sandboxes import SandboxObject
from deathwatch._operator.controller import Controller, Verdict
from deathwatch._operator.deathwatches import Change, DeathWatches
from deathwatch._operator.documents import FirewallReading
from deathwatch._operator.endpoints import serve
from deathwatch._operator.kube import (
    LEASES,
    ApiLease,
    ApiWrites,
    api_message,
    load_configuration,
    objects,
    status_code,
)
from deathwatch._operator.leader import Elector, LeaseTimings
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.reflector import Kind, Reflector, Undecodable, page
from deathwatch._operator.resources import DW_PLURAL, GROUP, SV_PLURAL, VERSION, to_document
from deathwatch._operator.rest import Rest
from deathwatch._operator.sandboxes import Sandboxes
from deathwatch._operator.shield import SELECTOR
from deathwatch._operator.shielding import Shielding
from deathwatch._operator.summary import Summaries
from deathwatch._operator.supervisor import Supervisor
from deathwatch._operator.watched import pods, sandboxes, verdicts
from deathwatch._operator.writer import Writer
from deathwatch._policies import default_registry

log = structlog.get_logger("deathwatch.app")

ADOPT_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # seconds between tries to list a namespace
REFREEZE_INTERVAL = 600.0  # seconds: sandboxes that arrived since the last freeze join it
STALE_AFTER = 90.0  # a watch with nothing (not even a bookmark) for this long is stale
SANDBOXES_WAIT = 30.0  # seconds start-up waits for the Sandboxes' first listing, at most


@dataclass(frozen=True)
class Config:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    kubeconfig: str | None = None
    http_host: str = "0.0.0.0"  # noqa: S104 - the probe and Prometheus reach it from outside
    http_port: int = 8080
    firewall_daemonset: str | None = None  # "namespace/name"
    pod_label_selector: str | None = None  # optional server-side prefilter of watched pods
    agent_sandbox: bool = True  # watch agent-sandbox's Sandboxes (if and once installed)
    probe_interval: float = 15.0  # /readyz and the firewall DaemonSet: one light call each
    coverage_interval: float = 5.0  # the firewall agents' coverage Leases: one list each
    publish_interval: float = 1.0  # DeathWatch status, at most once per interval
    stream_stale_after: float = STALE_AFTER
    retire_interval: float = 10.0  # how often verdicts past their retention are looked for
    writers: int = 8
    leader_elect: bool = True  # False: this process is the only writer (one replica)
    identity: str = "deathwatch"  # the pod's name: on the Lease, and as field manager
    lease_name: str = "deathwatch-controller"
    lease_namespace: str = "deathwatch-system"
    lease_timings: LeaseTimings = field(default_factory=LeaseTimings)

    @property
    def scopes(self) -> tuple[str | None, ...]:
        """What each reflector lists and watches: one namespace each, or everything."""
        return self.namespaces or (None,)


@dataclass
class Readiness:
    """What /readyz reports of the API; filled by the probe loop (no API call per request)."""

    api_reachable: bool | None = None
    api_error: str | None = None
    checked_at: datetime | None = None


class App:
    def __init__(self, config: Config, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.readiness = Readiness()
        self.supervisor = Supervisor(self.metrics)
        self.built = False
        self.started = False
        self.runner: Any = None
        self.gc_pauses: gcpauses.PauseLog | None = None
        self.elector: Elector | None = None
        self.rests: list[Rest] = []

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
        self.writes = rest("writes", cfg.writers + 2)
        self.watches = rest("watches", 2 * len(cfg.scopes) + 2)
        self.probe = rest("probe", 2)
        may_write: Callable[[], bool] = lambda: True  # noqa: E731 - the only writer
        if cfg.leader_elect:
            lease = ApiLease(rest("lease", 2), cfg.lease_name, cfg.lease_namespace,
                             cfg.lease_timings.renew_deadline / 2, cfg.identity)  # fmt: skip
            self.elector = Elector(lease, cfg.identity, cfg.lease_name, cfg.lease_namespace,
                                   metrics, cfg.lease_timings, on_change=self._leading)  # fmt: skip
            may_write = self.elector.may_write
        # the only writer stamps its statuses with its start time: a new process is a new term
        term = 0 if cfg.leader_elect else time.time_ns() // 1_000_000
        self.writer = Writer(
            ApiWrites(self.writes, may_write=may_write, field_manager=cfg.identity),
            metrics, may_write=may_write, leading=not cfg.leader_elect, term=term,
        )  # fmt: skip
        registry = default_registry()
        metrics.policies_known(registry.names)
        self.controller = Controller(
            deathwatches=DeathWatches(registry),
            sandboxes=Sandboxes(),
            fleet=Fleet(registry),
            summaries=Summaries(),
            writer=self.writer,
            metrics=metrics,
            shielding=Shielding(cfg.coverage_interval) if cfg.firewall_daemonset else None,
            leader=(lambda: self.elector.leader if self.elector else None)
            if cfg.leader_elect
            else (lambda: cfg.identity),
        )
        self.controller.firewall = FirewallReading(cfg.firewall_daemonset)
        self.controller.stale_after = cfg.stream_stale_after
        self.controller.fresh = self.pods_fresh
        self.verdict_reflectors = [
            Reflector(self.watches, verdicts(scope), _Verdicts(self), metrics)
            for scope in cfg.scopes
        ]
        self.sandbox_reflectors = [
            Reflector(self.watches, sandboxes(scope), _AgentSandboxes(self), metrics)
            for scope in (cfg.scopes if cfg.agent_sandbox else ())
        ]
        self.pod_reflectors = [
            Reflector(self.watches, pods(scope, cfg.pod_label_selector), _Pods(self), metrics)
            for scope in cfg.scopes
        ]
        self.built = True

    # --- start-up and shutdown -------------------------------------------------------------

    async def start(self, settings: kopf.OperatorSettings) -> None:
        """kopf's start-up handler: returns once verdicts, DeathWatches and pods are listed;
        kopf then watches the DeathWatches. A failing list is retried by its reflector
        (counted, logged); /healthz answers meanwhile."""
        configure_kopf(settings, self.config)
        if not self.built:
            self.build()
        if self.runner is None:
            cfg = self.config
            self.runner = await serve(
                cfg.http_host, cfg.http_port, self.supervisor, self.readyz_report, self.metrics
            )
        if self.started:
            return
        self.started = True
        for i, verdict_reflector in enumerate(self.verdict_reflectors):
            self.supervisor.start(f"watch-verdicts-{i}", verdict_reflector.run)
        await asyncio.gather(*(r.listed() for r in self.verdict_reflectors))
        await self.list_deathwatches()
        for i, sandbox_reflector in enumerate(self.sandbox_reflectors):
            self.supervisor.start(f"watch-sandboxes-{i}", sandbox_reflector.run)
        try:
            # Sandboxes before pods, so the first verdicts already name their claims; never
            # held up by them: a Sandbox watch that cannot list (RBAC) is retried, and logged
            async with asyncio.timeout(SANDBOXES_WAIT):
                await asyncio.gather(*(r.settled() for r in self.sandbox_reflectors))
        except TimeoutError:
            log.warning("agent-sandbox Sandboxes not listed yet: starting without them",
                        waited=SANDBOXES_WAIT)  # fmt: skip
        for i, pod_reflector in enumerate(self.pod_reflectors):
            self.supervisor.start(f"watch-pods-{i}", pod_reflector.run)
        await asyncio.gather(*(r.listed() for r in self.pod_reflectors))
        if self.elector is None:  # the only writer: it leads from the start
            self.reconcile_events()
        for i in range(self.config.writers):
            self.supervisor.start(f"writer-{i}", self.writer.work)
        if self.elector is not None:
            self.supervisor.start("leader-election", self.elector.run)
            self.supervisor.start("lease-watch", self.elector.watch)
        self.supervisor.start("deadlines", self.deadline_loop)
        self.supervisor.start("publish", self.publish_loop)
        self.supervisor.start("probe", self.probe_loop)
        if self.controller.shielding is not None:
            self.supervisor.start("firewall-coverage", self.coverage_loop)
        log.info("started", tracked=len(self.controller.sandboxes),
                 namespaces=list(self.config.namespaces) or "all")  # fmt: skip

    async def list_deathwatches(self) -> None:
        """Before the pods: so each pod of the first listing finds its DeathWatch."""
        for delay in (*ADOPT_BACKOFF, None):
            try:
                listings = [
                    await self.watches.get(objects(DW_PLURAL, s)) for s in self.config.scopes
                ]
            except Exception as exc:
                self.metrics.api_errors.labels("list_deathwatches", status_code(exc)).inc()
                log.error("deathwatches not listed", error=api_message(exc)[:300],
                          retry_in=delay)  # fmt: skip
                if delay is None:
                    return  # kopf's own listing of them follows; each then lists its pods
                await asyncio.sleep(delay)
                continue
            for listing in listings:
                for body in listing.get("items") or []:
                    with self.reported("deathwatch_event", body):
                        self.controller.on_deathwatch(None, body)
            return

    async def stop(self) -> None:
        """SIGTERM: a leader finishes what it decided (bounded), stops writing, then releases
        the Lease so a standby takes over at its next try instead of after the lease runs out."""
        if self.built and self.writer.leading:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.writer.idle(), 10)
            self.writer.standby()
        if self.elector is not None:
            await self.elector.release()
        await self.supervisor.stop()
        if self.gc_pauses is not None:
            gcpauses.uninstall(self.gc_pauses)
        if self.runner is not None:
            await self.runner.cleanup()
        for client in self.rests:
            await client.close()

    def _leading(self, leading: bool) -> None:
        """The elector's verdict: write (what this replica owes first), or stand by."""
        if not leading:
            self.writer.standby()
            return
        self.reconcile_events()
        owed = self.writer.lead(self.elector.term if self.elector else None)
        self.controller.republish(owed)

    def reconcile_events(self) -> None:
        """Taking over the writing: post again any SandboxDead Event a crash may have lost."""
        events = self.controller.unannounced_deaths()
        if events:
            log.info("reconciling sandboxdead events", count=len(events))
            self.writer.reconcile(events)

    # --- a new (or changed) DeathWatch: list its namespace's pods ------------------------

    async def adopt(self, change: Change) -> None:
        """List the pods of a new or changed DeathWatch's namespace, page by page, and hand
        them to the controller. A failed list is counted, logged and tried again with backoff
        (nothing else would bring those pods: they have no event to come)."""
        watch = change.watch
        assert watch is not None  # noqa: S101 - only valid DeathWatches select
        namespace, path = watch.namespace, f"/api/v1/namespaces/{watch.namespace}/pods"
        for delay in (*ADOPT_BACKOFF, None):
            adopted, token = 0, ""
            try:
                while True:
                    params: dict[str, str | int] = {"limit": 500}
                    if token:
                        params["continue"] = token
                    if self.config.pod_label_selector:
                        params["labelSelector"] = self.config.pod_label_selector
                    items, more = page(await self.watches.request("GET", path, params=params))
                    versions: dict[str, str] = {}
                    views = _views(items, versions)
                    adopted += self.controller.adopt(watch.key, watch.version, views, versions)
                    token = more or ""
                    current = self.controller.deathwatches.current(watch.key, watch.version)
                    if not token or current is None:
                        break
            except Exception as exc:
                self.metrics.api_errors.labels("list_pods", status_code(exc)).inc()
                log.error("pods of a deathwatch not listed", namespace=namespace,
                          deathwatch=watch.name, error=api_message(exc)[:300],
                          retry_in=delay)  # fmt: skip
                if delay is None:
                    return  # each pod's next event adopts it
                await asyncio.sleep(delay)
                continue
            log.info("deathwatch adopted existing pods", namespace=namespace,
                     deathwatch=watch.name, count=adopted)  # fmt: skip
            return

    # --- loops (each supervised) ------------------------------------------------------------

    async def deadline_loop(self) -> None:
        """Judge Suspects when their window closes, not when the next event happens to come."""
        c = self.controller
        while True:
            c.wake.clear()
            c.expire()
            deadline = c.fleet.next_deadline()
            timeout = (
                None
                if deadline is None
                else max(0.0, (deadline - datetime.now(UTC)).total_seconds())
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(c.wake.wait(), timeout)

    async def publish_loop(self) -> None:
        c = self.controller
        last_retire = 0.0
        frozen_at = time.monotonic()
        while True:
            await asyncio.sleep(self.config.publish_interval)
            if time.monotonic() - frozen_at > REFREEZE_INTERVAL:
                gcpauses.freeze("periodic")  # sandboxes that arrived since join the frozen
                frozen_at = time.monotonic()
            if time.monotonic() - last_retire > self.config.retire_interval:
                last_retire = time.monotonic()
                c.retire()
            c.reshield()  # coverage claims go stale with no event: judged on the clock
            c.publish()

    async def coverage_loop(self) -> None:
        """List the firewall agents' coverage Leases (one per node) every interval. A failed
        read is counted and logged; past a claim's validity without a read, every sandbox's
        Shielded turns Unknown rather than False (shield.py)."""
        namespace = (self.config.firewall_daemonset or "/").split("/", 1)[0]
        path = f"{LEASES}/namespaces/{namespace}/leases"
        failing = False
        while True:
            try:
                leases = await self.probe.get(path, labelSelector=SELECTOR)
            except Exception as exc:
                self.metrics.api_errors.labels("list_coverage", status_code(exc)).inc()
                if not failing:
                    log.warning("cannot read firewall coverage", error=api_message(exc)[:300])
                failing = True
            else:
                if failing:
                    log.info("firewall coverage readable again")
                failing = False
                self.controller.on_coverage(leases.get("items") or [])
                shielding = self.controller.shielding
                self.metrics.coverage_nodes.set(len(shielding.claims) if shielding else 0)
            await asyncio.sleep(self.config.coverage_interval)

    async def probe_loop(self) -> None:
        """One light API call per interval, on its own client: API reachability and the
        firewall DaemonSet's coverage, cached for /readyz and the DeathWatch status."""
        daemonset = self.config.firewall_daemonset
        while True:
            try:
                if daemonset:
                    ns, name = daemonset.split("/", 1)
                    self.controller.firewall = await self._read_daemonset(ns, name)
                else:
                    await self.probe.get("/version")
            except Exception as exc:
                if self.readiness.api_reachable is not False:
                    log.warning("API unreachable", error=api_message(exc)[:300])
                self.readiness.api_reachable = False
                self.readiness.api_error = api_message(exc)[:300]
                self.metrics.api_errors.labels("probe", status_code(exc)).inc()
            else:
                if self.readiness.api_reachable is False:
                    log.info("API reachable again")
                self.readiness.api_reachable, self.readiness.api_error = True, None
            self.readiness.checked_at = datetime.now(UTC)
            await asyncio.sleep(self.config.probe_interval)

    async def _read_daemonset(self, namespace: str, name: str) -> FirewallReading:
        full = f"{namespace}/{name}"
        try:
            ds = await self.probe.get(
                f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}/status"
            )
        except Exception as exc:
            if status_code(exc) != "404":
                raise
            return FirewallReading(full, observed_at=datetime.now(UTC),
                                   error=f"DaemonSet {full} not found")  # fmt: skip
        status = ds.get("status") or {}
        return FirewallReading(full, desired=int(status.get("desiredNumberScheduled") or 0),
                               ready=int(status.get("numberReady") or 0),
                               observed_at=datetime.now(UTC))  # fmt: skip

    # --- what is watched, fresh; /readyz ------------------------------------------------------

    def pods_fresh(self) -> bool | None:
        """Every pod stream delivered something (an event or a bookmark) lately."""
        if not self.built:
            return None
        stale = self.config.stream_stale_after
        return all(r.age() < stale for r in self.pod_reflectors)

    def readyz_report(self) -> tuple[bool, dict[str, Any]]:
        c, r = self.controller if self.built else None, self.readiness
        fw = c.firewall if c else None
        coverage = fw.coverage() if fw else None
        checks = {
            "api_reachable": bool(r.api_reachable),
            "watches_fresh": self.pods_fresh(),
            "firewall_covered": fw.covered if fw else None,
        }
        ages: dict[str, float] = {}
        reflectors: list[Reflector[Any]] = (
            [*self.pod_reflectors, *self.verdict_reflectors,
             *(r for r in self.sandbox_reflectors if not r.absent)] if self.built else []
        )  # fmt: skip
        for reflector in reflectors:
            name = reflector.collection.resource
            ages[name] = round(max(ages.get(name, 0.0), reflector.age()), 1)
        tasks = self.supervisor.tasks
        details = {
            "watch_stream_age_seconds": ages,
            "task_restarts": {name: t.restarts for name, t in tasks.items()},
            "failing_tasks": self.supervisor.failing(),
            "pods_with_failing_policy": len(c.policy_failing) if c else 0,
            "leader": self.elector.status() if self.elector else {"leader_election": "off"},
            "api_error": r.api_error,
            "api_checked_at": r.checked_at.isoformat() if r.checked_at else None,
            "firewall": to_document(coverage) if coverage else None,
            "tracked": len(c.sandboxes) if c else 0,
            "write_backlog": self.writer.backlog if self.built else 0,
            "agent_sandbox": self._agent_sandbox_state(),
        }
        ok = all(v is not False for v in checks.values())
        return ok, {**checks, "details": details}

    def _agent_sandbox_state(self) -> str:
        if not self.built or not self.sandbox_reflectors:
            return "off"
        if any(r.absent for r in self.sandbox_reflectors):
            return "not installed"
        if all(r.listings for r in self.sandbox_reflectors):
            return "watching"
        return "not listed yet"

    @contextlib.contextmanager
    def reported(self, handler: str, body: Any) -> Iterator[None]:
        """A bug in handling one event is logged with its traceback and counted, and the next
        event is handled afresh (never a stream torn down and listed again for one object)."""
        try:
            yield
        except Exception:
            self.metrics.handler_errors.labels(handler).inc()
            meta = body.get("metadata") or {} if isinstance(body, Mapping) else {}
            who = (meta.get("namespace"), meta.get("name")) if meta else (
                getattr(body, "namespace", None), getattr(body, "name", None)
            )  # fmt: skip
            log.exception("event not handled", handler=handler, namespace=who[0], name=who[1])


class _Pods:
    """The pod reflector's sink: each event to the controller, a bug in one contained."""

    def __init__(self, app: App) -> None:
        self.app, self.controller = app, app.controller

    def listing(self, scope: str | None) -> None:
        self.controller.listing(scope)

    def event(self, kind: Kind, pod: PodView, received: float, version: str) -> None:
        with self.app.reported("pod_event", pod):
            self.controller.on_pod(kind, pod, received, version)

    def listed(self, scope: str | None) -> None:
        with self.app.reported("pod_listing", {}):
            self.controller.listed(scope)
        # what a listing built lives as long as its pods: out of the collector's reach
        gcpauses.freeze("pod listing")

    def undecodable(self, error: Undecodable) -> None:
        self.controller.undecodable(error)


class _Verdicts:
    """The verdict reflector's sink: its first listing restores the engine's memory; after
    that, what the watch shows is what the API holds (writer.observed)."""

    def __init__(self, app: App) -> None:
        self.app, self.controller = app, app.controller
        self.restoring = True
        self.restored = 0
        self.seen: set[tuple[str, str]] = set()

    def listing(self, scope: str | None) -> None:
        self.seen = set()

    def event(self, kind: Kind, verdict: Verdict, received: float, version: str) -> None:
        with self.app.reported("verdict_event", verdict):
            if self.restoring:
                self.restored += self.controller.restore(verdict)
            else:
                if kind is Kind.LISTED:
                    self.seen.add((verdict.namespace, verdict.name))
                self.controller.on_verdict(kind, verdict)

    def listed(self, scope: str | None) -> None:
        if self.restoring:
            self.restoring = False
            log.info("restored verdicts", count=self.restored, scope=scope or "all")
            return
        # a relisting: verdicts it did not show were deleted meanwhile
        writer = self.app.writer
        for plural, namespace, name in list(writer.held):
            if (plural == SV_PLURAL and (scope is None or namespace == scope)
                    and (namespace, name) not in self.seen):  # fmt: skip
                writer.observed(plural, namespace, name, None, "")

    def undecodable(self, error: Undecodable) -> None:
        self.controller.undecodable(error)


class _AgentSandboxes:
    """The Sandbox reflector's sink: each Sandbox to the controller; a relisting's missing
    ones were deleted meanwhile."""

    def __init__(self, app: App) -> None:
        self.app, self.controller = app, app.controller
        self.seen: set[tuple[str, str]] = set()

    def listing(self, scope: str | None) -> None:
        self.seen = set()

    def event(self, kind: Kind, sandbox: SandboxObject, received: float, version: str) -> None:
        with self.app.reported("sandbox_event", sandbox):
            if kind is Kind.LISTED:
                self.seen.add((sandbox.namespace, sandbox.name))
            self.controller.on_agent_sandbox(kind, sandbox)

    def listed(self, scope: str | None) -> None:
        self.controller.agent_sandboxes.relisted(scope, self.seen)
        log.info("agent-sandbox Sandboxes listed", scope=scope or "all", count=len(self.seen))

    def undecodable(self, error: Undecodable) -> None:
        self.controller.undecodable(error)


def _views(items: Iterable[msgspec.Raw], versions: dict[str, str]) -> Iterator[PodView]:
    """The pods of a listed page, each decoded once from its bytes; their resourceVersions
    noted in `versions` by uid."""
    for item in items:
        try:
            view, version = decode_pod(item)
        except MalformedPod:
            continue  # its own watch event reports it
        versions[view.uid] = version
        yield view


def configure_kopf(settings: kopf.OperatorSettings, config: Config) -> None:
    settings.posting.enabled = False  # our Events are posted by the writer, once each
    settings.peering.standalone = True  # no kopf peering: the Lease elects the writer (ADR 0011)
    settings.scanning.disabled = True  # fixed resources: no CRD or namespace watching needed
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10
    # A watch request ends server-side after server_timeout; the client gives up after
    # client_timeout; no event and no bookmark for inactivity_timeout means a dead stream
    # (a silently dropped connection): kopf reconnects, resuming from the last version.
    settings.watching.server_timeout = 240
    settings.watching.client_timeout = 270
    settings.watching.connect_timeout = 10
    settings.watching.inactivity_timeout = 70


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

    @kopf.on.event(GROUP, VERSION, DW_PLURAL, id="deathwatch_event", registry=registry)
    async def deathwatch_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        change = None
        with app.reported("deathwatch_event", body):
            change = app.controller.on_deathwatch(event.get("type"), body)
        if change is not None:
            # the pods it selects that came before it: no pod event will tell of them
            await app.adopt(change)
