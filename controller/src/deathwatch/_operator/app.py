"""Wiring: kopf handlers, background loops and the HTTP endpoints around Tracker.

Handlers stay small: they hand pods and DeathWatches to the controller. Pods are watched with
`kopf.on.event` and indexed with `kopf.index` only: no change-detecting handlers, so kopf has
no reason to write annotations or finalizers onto a sandbox pod (a finalizer would block a
pod's deletion whenever the controller is down). kopf runs non-index handlers only after every
index is filled by the initial listings, so no pod is judged before the DeathWatches are known.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kopf
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from deathwatch._engine.timeutil import UTC
from deathwatch._operator import gcpauses
from deathwatch._operator.documents import FirewallReading
from deathwatch._operator.kube import (
    Api,
    ApiLease,
    ApiWrites,
    api_message,
    load_configuration,
    status_code,
)
from deathwatch._operator.leader import Elector, LeaseTimings
from deathwatch._operator.metrics import Metrics
from deathwatch._operator.resources import DW_PLURAL, GROUP, SV_PLURAL, VERSION, to_document
from deathwatch._operator.shield import SELECTOR
from deathwatch._operator.spec import SpecError, Watch, read_deathwatch
from deathwatch._operator.streams import STALE_AFTER, StreamActivity
from deathwatch._operator.streams import install as install_stream_hook
from deathwatch._operator.supervisor import Supervisor
from deathwatch._operator.tracker import Tracker
from deathwatch._operator.writer import Writer
from deathwatch._policies import default_registry

log = structlog.get_logger("deathwatch.app")

ADOPT_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)  # seconds between tries to list a namespace
REFREEZE_INTERVAL = 600.0  # seconds: sandboxes that arrived since the last freeze join it


@dataclass(frozen=True)
class Config:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    kubeconfig: str | None = None
    http_host: str = "0.0.0.0"  # noqa: S104 - the probe and Prometheus reach it from outside
    http_port: int = 8080
    firewall_daemonset: str | None = None  # "namespace/name"
    pod_label_selector: str | None = None  # optional server-side prefilter of watched pods
    probe_interval: float = 15.0  # /readyz and firewall coverage: one light API call per interval
    coverage_interval: float = 5.0  # the firewall agents' coverage Leases: one list per interval
    publish_interval: float = 1.0  # DeathWatch status, at most once per interval
    stream_stale_after: float = STALE_AFTER  # nothing from a watch stream this long: stale
    retire_interval: float = 10.0  # how often verdicts past their retention are looked for
    vanished_interval: float = 5.0  # how often pods no watch shows are looked up
    writers: int = 8
    leader_elect: bool = True  # False: this process is the only writer (one replica)
    identity: str = "deathwatch"  # the pod's name: on the Lease, and as field manager
    lease_name: str = "deathwatch-controller"
    lease_namespace: str = "deathwatch-system"
    lease_timings: LeaseTimings = field(default_factory=LeaseTimings)

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces


@dataclass
class Readiness:
    """What /readyz reports; filled by the probe loop, read by the handler (no API call)."""

    api_reachable: bool | None = None
    api_error: str | None = None
    checked_at: datetime | None = None


@dataclass
class App:
    config: Config
    metrics: Metrics = field(default_factory=Metrics)
    readiness: Readiness = field(default_factory=Readiness)
    tracker: Tracker | None = None
    writer: Writer | None = None
    api: Api | None = None
    probe_api: Api | None = None
    lease_api: Api | None = None
    supervisor: Supervisor = field(init=False)
    streams: StreamActivity = field(init=False)
    elector: Elector | None = None
    runner: web.AppRunner | None = None
    gc_pauses: gcpauses.PauseLog | None = None

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(self.metrics)
        self.streams = StreamActivity(self.metrics)

    # --- startup and shutdown ------------------------------------------------------------

    async def start(self, settings: kopf.OperatorSettings) -> None:
        """kopf's startup handler, retried (TemporaryError) until the verdicts can be listed:
        so every step before that must be done once, however often this runs."""
        configure_kopf(settings, self.config)
        if self.tracker is None:
            self._build()
        if self.runner is None:
            await self.serve_http()  # /healthz answers while the API is still out of reach
        assert self.tracker is not None  # noqa: S101 - made by _build
        assert self.writer is not None  # noqa: S101
        restored = self.tracker.restore(await self.list_verdicts())
        log.info(
            "restored verdicts", count=restored, namespaces=list(self.config.namespaces) or "all"
        )
        if self.elector is None:  # the only writer: it leads from the start
            self.reconcile_events()
        self.writer.start(self.supervisor.start)
        if self.elector is not None:
            self.supervisor.start("leader-election", self.elector.run)
            self.supervisor.start("lease-watch", self.elector.watch)
        self.supervisor.start("deadlines", self.deadline_loop)
        self.supervisor.start("publish", self.publish_loop)
        self.supervisor.start("vanished", self.vanished_loop)
        self.supervisor.start("probe", self.probe_loop)
        if self.tracker is not None and self.tracker.coverage is not None:
            self.supervisor.start("firewall-coverage", self.coverage_loop)

    def _build(self) -> None:
        self.gc_pauses = gcpauses.install(self.metrics)
        configuration = load_configuration(self.config.kubeconfig)
        self.api = Api(configuration, self.config.writers + 2, "writes", self.config.identity)
        # /readyz and firewall coverage use their own client and thread: they can never
        # queue behind, or take a slot from, the controller's own API work
        self.probe_api = Api(
            load_configuration(self.config.kubeconfig), 1, "probe", self.config.identity
        )
        cfg = self.config
        may_write: Callable[[], bool] = lambda: True  # noqa: E731 - the only writer
        if cfg.leader_elect:
            # the Lease on a client of its own: a renewal never waits behind writes (two
            # connections: the renewals', and the Lease watch's on its own thread)
            self.lease_api = Api(load_configuration(cfg.kubeconfig), 2, "lease", cfg.identity)
            lease = ApiLease(
                self.lease_api,
                cfg.lease_name,
                cfg.lease_namespace,
                cfg.lease_timings.renew_deadline / 2,
                cfg.identity,
            )
            self.elector = Elector(
                lease,
                cfg.identity,
                cfg.lease_name,
                cfg.lease_namespace,
                self.metrics,
                cfg.lease_timings,
                on_change=self._leading,
            )
            may_write = self.elector.may_write
        writes = ApiWrites(self.api, may_write=may_write, field_manager=cfg.identity)
        # the only writer stamps its statuses with its start time: a new process is a new term
        # (with election, the term is the Lease's, given on each acquisition)
        term = 0 if cfg.leader_elect else time.time_ns() // 1_000_000
        self.writer = Writer(writes, self.metrics, workers=cfg.writers, may_write=may_write,
                             leading=not cfg.leader_elect, term=term)  # fmt: skip
        if not install_stream_hook(self.streams):
            log.warning("watch stream liveness cannot be observed; /readyz reports it unknown")
        self.tracker = Tracker(
            default_registry(),
            self.writer,
            self.metrics,
            streams=self.streams,
            stale_after=self.config.stream_stale_after,
        )
        self.tracker.firewall = FirewallReading(self.config.firewall_daemonset)
        if self.config.firewall_daemonset:
            # the agents' coverage Leases live next to their DaemonSet: judge Shielded
            self.tracker.coverage = {}
            self.tracker.coverage_interval = self.config.coverage_interval
        if self.elector is not None:
            self.tracker.leader = lambda: self.elector.leader if self.elector else None
        else:
            self.tracker.leader = lambda: cfg.identity

    def _leading(self, leading: bool) -> None:
        """The elector's verdict: write (everything pending that differs), or stand by."""
        if self.writer is None:
            return
        if leading:
            self.reconcile_events()
            self.writer.lead(self.elector.term if self.elector else None)
        else:
            self.writer.standby()

    def reconcile_events(self) -> None:
        """Taking over the writing: post again any SandboxDead Event a crash may have lost."""
        if self.tracker is None or self.writer is None:
            return
        events = self.tracker.unannounced_deaths()
        if events:
            log.info("reconciling sandboxdead events", count=len(events))
            self.writer.reconcile(events)

    async def list_verdicts(self) -> list[dict[str, Any]]:
        assert self.api is not None  # noqa: S101 - set in start()
        custom = self.api.custom
        items: list[dict[str, Any]] = []
        try:
            if self.config.clusterwide:
                items.extend(
                    (
                        await self.api.call(
                            custom.list_cluster_custom_object, GROUP, VERSION, SV_PLURAL
                        )
                    )["items"]
                )
            else:
                for ns in self.config.namespaces:
                    items.extend(
                        (
                            await self.api.call(
                                custom.list_namespaced_custom_object, GROUP, VERSION, ns, SV_PLURAL
                            )
                        )["items"]
                    )
        except Exception as exc:
            self.metrics.api_errors.labels("list_verdicts", status_code(exc)).inc()
            # kopf retries the startup handler; no pod is judged until this succeeds
            raise kopf.TemporaryError(
                f"cannot list SandboxVerdicts: {api_message(exc)}", delay=2
            ) from exc
        return items

    async def adopt_existing(self, spec: Watch) -> None:
        """List the pods of a new (or changed) DeathWatch's namespace, page by page, and hand
        them to the tracker. A failed list is counted, logged and tried again with backoff
        (nothing else would bring those pods: they have no event to come)."""
        assert self.api is not None  # noqa: S101 - started
        assert self.tracker is not None  # noqa: S101
        core, namespace = self.api.core, spec.key[0]
        for delay in (*ADOPT_BACKOFF, None):
            adopted, token = 0, None
            try:
                while True:
                    response = await self.api.call(
                        core.list_namespaced_pod,
                        namespace,
                        label_selector=self.config.pod_label_selector or None,
                        limit=500,
                        _continue=token,
                        _preload_content=False,
                    )
                    page = json.loads(response.data)
                    adopted += self.tracker.adopt(spec, page.get("items") or [])
                    token = (page.get("metadata") or {}).get("continue")
                    if not token:
                        break
            except Exception as exc:
                self.metrics.api_errors.labels("list_pods", status_code(exc)).inc()
                log.error(
                    "pods of a deathwatch not listed",
                    namespace=namespace,
                    deathwatch=spec.key[1],
                    error=api_message(exc),
                    retry_in=delay,
                )
                if delay is None:
                    return  # each pod's next event adopts it
                await asyncio.sleep(delay)
                continue
            log.info(
                "deathwatch adopted existing pods",
                namespace=namespace,
                deathwatch=spec.key[1],
                count=adopted,
            )
            return

    async def stop(self) -> None:
        """SIGTERM: a leader finishes what it decided (bounded), stops writing, then releases
        the Lease so a standby takes over at its next try instead of after the lease runs out."""
        if self.writer is not None and self.writer.leading:
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
        for api in (self.api, self.probe_api, self.lease_api):
            if api is not None:
                api.close()

    # --- loops ------------------------------------------------------------------------------

    async def deadline_loop(self) -> None:
        """Judge Suspects when their window closes, not when the next event happens to come."""
        c = self.tracker
        assert c is not None  # noqa: S101
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
        c = self.tracker
        assert c is not None  # noqa: S101
        last_retire = 0.0
        frozen_for, frozen_at = 0, time.monotonic()
        while True:
            await asyncio.sleep(self.config.publish_interval)
            listing = c.listing_settled()
            if listing != frozen_for or time.monotonic() - frozen_at > REFREEZE_INTERVAL:
                # what a listing built lives as long as its pods: out of the collector's reach
                gcpauses.freeze("pod listing" if listing != frozen_for else "periodic")
                frozen_for, frozen_at = listing, time.monotonic()
            if time.monotonic() - last_retire > self.config.retire_interval:
                last_retire = time.monotonic()
                c.retire()
            c.reshield()  # coverage claims go stale with no event: judged on the clock
            await c.publish()

    async def vanished_loop(self) -> None:
        """Pods deleted while we were down or while a watch was broken produce no DELETED
        event; find them and confirm each with a GET before calling them gone."""
        c, api = self.tracker, self.api
        assert c is not None  # noqa: S101
        assert api is not None  # noqa: S101
        while True:
            await asyncio.sleep(self.config.vanished_interval)
            for uid in c.vanished()[:50]:
                record = c.records.get(uid)
                if record is None:
                    continue
                try:
                    pod = await api.call(
                        api.core.read_namespaced_pod, record.name, record.namespace
                    )
                except Exception as exc:
                    if status_code(exc) == "404":
                        c.gone(uid)
                    else:
                        self.metrics.api_errors.labels("read_pod", status_code(exc)).inc()
                    continue
                if pod.metadata.uid == uid:
                    c.still_there(uid)
                else:
                    c.gone(uid)  # the name belongs to a newer pod

    async def coverage_loop(self) -> None:
        """List the firewall agents' coverage Leases (one per node) every interval. A failed
        read is counted and logged; past a claim's validity without a read, every sandbox's
        Shielded turns Unknown rather than False (shield.py)."""
        c, api = self.tracker, self.probe_api
        assert c is not None  # noqa: S101
        assert api is not None  # noqa: S101
        namespace = (self.config.firewall_daemonset or "/").split("/", 1)[0]
        failing = False
        while True:
            try:
                leases = await api.call(
                    api.coordination.list_namespaced_lease, namespace, label_selector=SELECTOR
                )
            except Exception as exc:
                self.metrics.api_errors.labels("list_coverage", status_code(exc)).inc()
                if not failing:
                    log.warning("cannot read firewall coverage", error=api_message(exc)[:300])
                failing = True
            else:
                if failing:
                    log.info("firewall coverage readable again")
                failing = False
                items = api.client.sanitize_for_serialization(leases).get("items") or []
                c.on_coverage(items)
                self.metrics.coverage_nodes.set(len(c.coverage or {}))
            await asyncio.sleep(self.config.coverage_interval)

    async def probe_loop(self) -> None:
        """One light API call per interval, on its own client: API reachability and the
        firewall DaemonSet's coverage, cached for /readyz and the DeathWatch status."""
        c, api = self.tracker, self.probe_api
        assert c is not None  # noqa: S101
        assert api is not None  # noqa: S101
        while True:
            daemonset = c.firewall.daemonset
            try:
                if daemonset:
                    ns, name = daemonset.split("/", 1)
                    try:
                        ds = await api.call(api.apps.read_namespaced_daemon_set_status, name, ns)
                    except Exception as exc:
                        if status_code(exc) != "404":
                            raise
                        c.firewall = FirewallReading(
                            daemonset,
                            observed_at=datetime.now(UTC),
                            error=f"DaemonSet {daemonset} not found",
                        )
                    else:
                        c.firewall = FirewallReading(
                            daemonset,
                            desired=ds.status.desired_number_scheduled or 0,
                            ready=ds.status.number_ready or 0,
                            observed_at=datetime.now(UTC),
                        )
                else:
                    await api.call(api.version.get_code)
            except Exception as exc:
                if self.readiness.api_reachable is not False:
                    log.warning("API unreachable", error=api_message(exc)[:300])
                self.readiness.api_reachable, self.readiness.api_error = (
                    False,
                    api_message(exc)[:300],
                )
                self.metrics.api_errors.labels("probe", status_code(exc)).inc()
            else:
                if self.readiness.api_reachable is False:
                    log.info("API reachable again")
                self.readiness.api_reachable, self.readiness.api_error = True, None
            self.readiness.checked_at = datetime.now(UTC)
            await asyncio.sleep(self.config.probe_interval)

    # --- HTTP: /healthz, /readyz, /metrics ----------------------------------------------------

    async def serve_http(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_handler)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.config.http_host, self.config.http_port).start()

    async def healthz(self, request: web.Request) -> web.Response:
        # The process alone: answering at all proves the event loop is not blocked, and no
        # supervised task of ours keeps crashing (a bug a fresh process may not have). It
        # checks no dependency: the loops catch API failures, an outage never crashes them,
        # and a liveness probe that checked the API would restart a healthy controller.
        failing = self.supervisor.failing()
        if failing:
            return web.json_response({"failing_tasks": failing}, status=500)
        return web.Response(text="ok\n")

    def readyz_report(self) -> tuple[bool, dict[str, Any]]:
        c, r = self.tracker, self.readiness
        fresh = c.watches_fresh() if c else False
        fw = c.firewall if c else None
        coverage = fw.coverage() if fw else None
        checks = {
            "api_reachable": bool(r.api_reachable),
            "watches_fresh": fresh,
            "firewall_covered": fw.covered if fw else None,
        }
        last_pod_event = c.last_event.get("pods") if c else None
        tasks = self.supervisor.tasks
        details = {
            "watch_stream_age_seconds": {
                r: round(self.streams.age(r), 1) for r in ("pods", DW_PLURAL)
            },
            "task_restarts": {name: t.restarts for name, t in tasks.items()},
            "failing_tasks": self.supervisor.failing(),
            "pods_with_failing_policy": len(c.policy_failing) if c else 0,
            "leader": self.elector.status() if self.elector else {"leader_election": "off"},
            "api_error": r.api_error,
            "api_checked_at": r.checked_at.isoformat() if r.checked_at else None,
            "seconds_since_pod_event": round(time.monotonic() - last_pod_event, 1)
            if last_pod_event
            else None,
            "firewall": to_document(coverage) if coverage else None,
            "tracked": len(c.fleet) if c else 0,
            "write_backlog": self.writer.backlog if self.writer else 0,
        }
        ok = all(v is not False for v in checks.values())
        return ok, {**checks, "details": details}

    async def readyz(self, request: web.Request) -> web.Response:
        # For people, wired to no probe: a dependency outage must not restart or unroute us.
        # Served from the probe loop's cache: costs no API call, takes no controller slot.
        ok, report = self.readyz_report()
        return web.json_response(report, status=200 if ok else 503)

    def observed(self, plural: str, event_type: str | None, body: Mapping[str, Any]) -> None:
        if self.writer is None:
            return
        meta = body.get("metadata") or {}
        status = None if event_type == "DELETED" else dict(body.get("status") or {})
        self.writer.observed(plural, meta.get("namespace") or "", meta.get("name") or "", status,
                             meta.get("resourceVersion"))  # fmt: skip

    @contextlib.contextmanager
    def reported(self, handler: str, body: Mapping[str, Any]) -> Iterator[None]:
        """A bug in handling one event is logged with its traceback and counted, and the
        next event of the object is handled afresh (kopf would only say "will ignore it")."""
        try:
            yield
        except Exception:
            self.metrics.handler_errors.labels(handler).inc()
            meta = body.get("metadata") or {}
            log.exception(
                "event not handled", handler=handler, namespace=meta.get("namespace"),
                name=meta.get("name"),
            )  # fmt: skip

    async def metrics_handler(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.metrics.registry),
            headers={"Content-Type": CONTENT_TYPE_LATEST},
        )


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
    if config.pod_label_selector:  # server-side prefilter: only these pods are ever sent to us
        settings.watching.label_selectors["pods"] = config.pod_label_selector


def register(registry: kopf.OperatorRegistry, app: App) -> None:
    """Attach the handlers to a kopf registry. Small and declarative: the work is elsewhere."""

    @kopf.on.login(id="login", registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # The same as the API client (kube.load_configuration): --kubeconfig if given, else
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

    @kopf.index(GROUP, VERSION, DW_PLURAL, id="deathwatches_by_namespace", registry=registry)
    def deathwatches_by_namespace(
        namespace: str | None, body: kopf.Body, **_: Any
    ) -> dict[str, Watch]:
        try:
            return {namespace or "": read_deathwatch(body, default_registry())}
        except SpecError:
            return {}  # reported on the DeathWatch's status by the event handler

    @kopf.on.event("", "v1", "pods", id="pod_event", registry=registry)
    async def pod_event(
        event: kopf.RawEvent, body: kopf.Body, namespace: str | None, **kwargs: Any
    ) -> None:
        if app.tracker is not None:
            watches = _values(kwargs["deathwatches_by_namespace"], namespace or "")
            with app.reported("pod_event", body):
                app.tracker.on_pod(event.get("type"), body, watches)

    @kopf.on.event(GROUP, VERSION, DW_PLURAL, id="deathwatch_event", registry=registry)
    async def deathwatch_event(
        event: kopf.RawEvent, body: kopf.Body, namespace: str | None, **kwargs: Any
    ) -> None:
        if app.tracker is None:
            return
        with app.reported("deathwatch_event", body):
            spec = app.tracker.on_deathwatch(event.get("type"), body)
            app.observed(DW_PLURAL, event.get("type"), body)
        if spec is not None:
            # pods it selects that came before it: the pod stream will not tell of them again
            # (at start-up this lists what kopf's own listing also brings: seen twice, judged
            # once; "has the pod stream begun" cannot tell an empty first listing from none)
            await app.adopt_existing(spec)

    @kopf.on.event(GROUP, VERSION, SV_PLURAL, id="verdict_event", registry=registry)
    async def verdict_event(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> None:
        # what the leader published: a standby keeps up with it, so that on takeover it
        # writes only what differs (writer.observed; ignored while leading)
        with app.reported("verdict_event", body):
            app.observed(SV_PLURAL, event.get("type"), body)


def _values(index: kopf.Index[str, Any], key: str) -> Iterable[Any]:
    try:
        return list(index[key])
    except KeyError:
        return []
