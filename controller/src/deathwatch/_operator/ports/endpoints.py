"""The controller's two ports (ADR 0020), each reachable from every pod of the cluster:

- **the metrics port** (HTTPS, `--metrics-address`, default :8443): `/metrics` to whom the
  API server's RBAC lets `get` it (TokenReview, then SubjectAccessReview: the chart's
  `deathwatch-metrics-reader` ClusterRole), `/readyz` up or down to anyone and its details
  to whom may `get` /metrics, `/healthz`; served on the event loop within the server's
  limits, the page rendered off it (deathwatch._kube.ports);
- **the health port** (HTTP, `--health-address`, default :8081): `/healthz` and `/readyz`
  (up or down) for the kubelet, on a listener, a thread and an event loop of their own:
  nothing done to the other port can make a probe wait.

Field notes: /healthz checks no dependency (a liveness probe that checked the API would turn an
API outage into a restart loop that fixes nothing); it fails only when the event loop stops
turning (the heartbeat: a synchronous call blocking it is what liveness exists to catch) or a
supervised task of ours keeps crashing. /readyz says how the dependencies are, from state the
loops keep (no API call), wired to no restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog
from prometheus_client import generate_latest

from deathwatch._api.rest import Rest
from deathwatch._kube.access import Access
from deathwatch._kube.ports import Heartbeat, MetricsPort, PortsCollector, health_port
from deathwatch._kube.scrape import Scrapes
from deathwatch._kube.serving import Limits, Server
from deathwatch._kube.tls import CertificateError, Serving
from deathwatch._operator.instruments.metrics import Metrics

log = structlog.get_logger("deathwatch.endpoints")
REVIEW_DEADLINE: Final = 5.0  # seconds a TokenReview or SubjectAccessReview may take
CERT_REFRESH: Final = 60.0  # seconds between looks at a mounted certificate
Address = tuple[str, int]
Report = Callable[[], tuple[bool, Mapping[str, Any]]]


def address(text: str) -> Address:
    """`HOST:PORT`, `:PORT` (every address) or `[V6]:PORT`; ValueError naming the value."""
    host, sep, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not 0 <= number < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - probes and Prometheus come from outside
    return host, number


class Endpoints:
    def __init__(
        self,
        *,
        metrics_address: Address,
        health_address: Address,
        cert_dir: Path | None,
        names: list[str],
        limits: Limits,
        metrics: Metrics,
        reviews: Rest,
        readiness: Report,
        heartbeat: Heartbeat,
    ) -> None:
        """Raises CertificateError for a mounted certificate that cannot be used."""
        self.metrics_address, self.reviews = metrics_address, reviews
        self.access = Access(self._review)
        self.scrapes = Scrapes(lambda: generate_latest(metrics.registry))
        self.tls = Serving(cert_dir, names)
        handler = MetricsPort(self.access, self.scrapes, heartbeat, readiness,
                              answer_within=limits.answer_timeout)  # fmt: skip
        self.server = Server(handler.handle, limits, self.tls.context)
        self.health = health_port(heartbeat, *health_address)
        metrics.registry.register(PortsCollector(
            "deathwatch", {"metrics": lambda: self.server, "health": lambda: self.health.server},
            self.access, self.scrapes, certificate=lambda: self.tls.not_after,
        ))  # fmt: skip

    async def _review(self, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        answer: Mapping[str, Any] = msgspec.json.decode(
            await self.reviews.request("POST", path, body=body, deadline=REVIEW_DEADLINE)
        )
        return answer

    async def start(self) -> tuple[int, int]:
        """Both listening; returns (metrics port, health port). The health port first: the
        kubelet may probe from now on."""
        health = await asyncio.to_thread(self.health.start)
        port = await self.server.start(*self.metrics_address)
        log.info("listening", metrics=f"https://{self.metrics_address[0]}:{port}",
                 health=f"http://{self.health.host}:{health}")  # fmt: skip
        return port, health

    async def certificates(self) -> None:
        """A mounted certificate read again when cert-manager renews it (a supervised task;
        nothing to do for a self-signed one)."""
        while self.tls.directory is not None:
            await asyncio.sleep(CERT_REFRESH)
            try:
                if self.tls.refresh():
                    log.info("serving certificate reloaded", directory=str(self.tls.directory))
            except CertificateError as exc:
                log.error("serving certificate unusable; the last one stays", error=str(exc))

    async def stop(self) -> None:
        await self.server.close()
        await asyncio.to_thread(self.health.stop)
