"""The agent's port (ADR 0020). The agent runs on its node's network (hostNetwork), so every
pod of the cluster reaches this port at its node's address: it gets what the controller's
metrics port gets (deathwatch._kube.ports), on a listener of its own within the same limits:

- `/metrics` over HTTPS, to whom the API server's RBAC lets `get` it (TokenReview, then
  SubjectAccessReview, made with the agent's own client, in a worker thread); the page
  rendered off the listener's loop, reused for a second;
- `/healthz`, to anyone: whether the agent's loop still turns (it beats at every step);
- `/readyz` where the process has one (the exit observer): up or down to anyone, its details
  to whom may get /metrics.

Without a cluster (no `--node-name`: nothing to ask who a token is) it serves /metrics over
plain HTTP, and only on a loopback address: an open port with no one to authorize is what
ADR 0020 closes.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest

from deathwatch._kube.access import Access
from deathwatch._kube.errors import NoAnswer
from deathwatch._kube.ports import Heartbeat, Listener, MetricsPort, PortsCollector, Readiness
from deathwatch._kube.scrape import Scrapes
from deathwatch._kube.serving import Limits, Request, Response
from deathwatch._kube.tls import Serving
from deathwatch.firewall.kubeapi import Api

REVIEW_DEADLINE: Final = 5.0


class OpenPort(Exception):
    """An address the agent will not serve on without a cluster to authorize scrapes."""


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def listener(
    host: str,
    port: int,
    registry: CollectorRegistry,
    heartbeat: Heartbeat,
    api: Api | None,
    cert_dir: Path | None = None,
    names: tuple[str, ...] = (),
    limits: Limits | None = None,
    readiness: Readiness | None = None,
) -> Listener:
    """The agent's port, not yet listening (`.start()`). Raises OpenPort for a
    non-loopback address with no API, tls.CertificateError for unusable mounted files."""
    limits = limits or Limits()
    scrapes = Scrapes(lambda: generate_latest(registry))
    if api is None:
        if not loopback(host):
            raise OpenPort(
                f"{host}: without a cluster to authorize scrapes (--node-name), /metrics is "
                "served on a loopback address only (127.0.0.1, ::1)"
            )

        async def plain(request: Request) -> Response:
            if request.path == "/metrics":
                page = await scrapes.page(limits.answer_timeout)
                if page is None:
                    return Response.text(503, "busy: try again")
                return Response(200, page, "text/plain; version=0.0.4; charset=utf-8")
            if request.path == "/healthz":
                ok, said = heartbeat.health()
                return Response.text(200 if ok else 500, said)
            return Response.text(404, "not found")

        registry.register(PortsCollector("deathwatch_firewall", {}, None, scrapes))
        return Listener(plain, host, port, limits, name="metrics-port")

    async def review(path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        try:
            answer: Mapping[str, Any] = await asyncio.wait_for(
                asyncio.to_thread(api.call, "POST", path, dict(body)), REVIEW_DEADLINE
            )
        except TimeoutError:
            raise NoAnswer(f"POST {path}: no answer in {REVIEW_DEADLINE} s",
                              timeout=True) from None  # fmt: skip
        return answer

    access = Access(review)
    port_handler = MetricsPort(access, scrapes, heartbeat, readiness, limits.answer_timeout)
    tls = Serving(cert_dir, list(names) or ["localhost"])
    made = Listener(port_handler.handle, host, port, limits, tls.context, name="metrics-port")
    registry.register(PortsCollector("deathwatch_firewall", {"metrics": lambda: made.server},
                                     access, scrapes, lambda: tls.not_after))  # fmt: skip
    return made
