"""The HTTP endpoints: /healthz (the process), /readyz (for people), /metrics (Prometheus).

Field notes: /healthz checks no dependency (a liveness probe that checked the API would turn an
API outage into a restart loop that fixes nothing); it fails only when the event loop cannot
answer or a supervised task of ours keeps crashing. /readyz says how the dependencies are,
for people, is wired to no probe, and is served from state the loops keep (no API call, no
slot taken from the controller's own work), so hammering it costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from deathwatch._operator.metrics import Metrics
from deathwatch._operator.supervisor import Supervisor

Report = Callable[[], tuple[bool, dict[str, Any]]]


async def serve(host: str, port: int, supervisor: Supervisor, readiness: Report,
                metrics: Metrics) -> web.AppRunner:  # fmt: skip
    async def healthz(_: web.Request) -> web.Response:
        failing = supervisor.failing()
        if failing:
            return web.json_response({"failing_tasks": failing}, status=500)
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        ok, report = readiness()
        return web.json_response(report, status=200 if ok else 503)

    async def metrics_page(_: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
