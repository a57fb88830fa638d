"""What the controller reads on a period, each a supervised task making one light call per
interval on its own client: the firewall agents' coverage Leases (every verdict's
Shielded), and the probe (the API's reachability, and the firewall DaemonSet's coverage) for
/readyz and the DeathWatch status. A failed read is counted and logged once per spell; past a
claim's validity without a read, every sandbox's Shielded turns Unknown rather than False
(shield.py); /readyz says the API is unreachable."""

from __future__ import annotations

import asyncio
from datetime import datetime

import msgspec
import structlog

from deathwatch._api.resources import LEASES
from deathwatch._api.rest import Rest
from deathwatch._engine.timeutil import UTC
from deathwatch._kube.errors import ApiError, describe, label
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.core import Firewall
from deathwatch._operator.passes.shielding import ShieldPass
from deathwatch._operator.reporting.deathwatch_status import FirewallReading
from deathwatch._operator.reporting.shield import SELECTOR
from deathwatch._operator.sources.readiness import Readiness

log = structlog.get_logger("deathwatch.reads")
PROBE_DEADLINE = 10.0  # seconds a probe of the API waits for its answer (light calls)


async def coverage(shielding: ShieldPass, rest: Rest, metrics: Metrics, namespace: str,
                   interval: float) -> None:  # fmt: skip
    """List the firewall agents' coverage Leases (one per node) every interval."""
    path = f"{LEASES}/namespaces/{namespace}/leases"
    failing = False
    while True:
        try:
            leases = await rest.get(path, labelSelector=SELECTOR)
        except Exception as exc:
            metrics.api_errors.labels("list_coverage", label(exc)).inc()
            if not failing:
                log.warning("cannot read firewall coverage", error=describe(exc)[:300])
            failing = True
        else:
            if failing:
                log.info("firewall coverage readable again")
            failing = False
            claims = shielding.on_coverage(leases.get("items") or [])
            metrics.coverage_nodes.set(claims)
        await asyncio.sleep(interval)


async def probe(firewall: Firewall, rest: Rest, metrics: Metrics, readiness: Readiness,
                daemonset: str | None, interval: float) -> None:  # fmt: skip
    """One light call per interval: the firewall DaemonSet's status (which also says the
    API answers), or the API's /version when no firewall is configured. Each waits at most
    PROBE_DEADLINE, not the 30 s cap of every call: an answer to either takes milliseconds,
    and /readyz says the API unreachable within the interval and this deadline (25 s, was
    45)."""
    while True:
        try:
            if daemonset:
                firewall.reading = await _read_daemonset(rest, daemonset)
            else:
                await rest.request("GET", "/version", deadline=PROBE_DEADLINE)
        except Exception as exc:
            if readiness.api_reachable is not False:
                log.warning("API unreachable", error=describe(exc)[:300])
            readiness.api_reachable = False
            readiness.api_error = describe(exc)[:300]
            metrics.api_errors.labels("probe", label(exc)).inc()
        else:
            if readiness.api_reachable is False:
                log.info("API reachable again")
            readiness.api_reachable, readiness.api_error = True, None
        readiness.checked_at = datetime.now(UTC)
        await asyncio.sleep(interval)


class _DaemonSetStatus(msgspec.Struct, rename="camel"):
    desired_number_scheduled: int = 0
    number_ready: int = 0


class _DaemonSet(msgspec.Struct):
    status: _DaemonSetStatus = msgspec.field(default_factory=_DaemonSetStatus)


async def _read_daemonset(rest: Rest, full: str) -> FirewallReading:
    namespace, name = full.split("/", 1)
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}/status"
    try:
        data = await rest.request("GET", path, deadline=PROBE_DEADLINE)
    except ApiError as exc:
        if not exc.not_found:
            raise
        return FirewallReading(full, observed_at=datetime.now(UTC),
                               error=f"DaemonSet {full} not found")  # fmt: skip
    status = msgspec.json.decode(data, type=_DaemonSet).status
    return FirewallReading(full, desired=status.desired_number_scheduled,
                           ready=status.number_ready, observed_at=datetime.now(UTC))  # fmt: skip
