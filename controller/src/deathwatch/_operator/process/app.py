"""The controller process: its parts built once (assembly.py), started in order (startup.py),
stopped in order; what its health ports say. Nothing else: the work is in the parts
(docs/architecture.md).

kopf keeps the process's life (login, start-up, clean-up: lifecycle.py); pods, verdicts,
DeathWatches and Sandboxes come through our own reflectors (reflector.py, ADR 0014).
DeathWatches were kopf's until #43: most of their events are the controller's own status
writes, which every process receives, and kopf's handler cost each a whole decode and a handler
call; ours reads their metadata and, when only the status moved, just what this process needs
of it (watched.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

from deathwatch._kube.ports import Heartbeat
from deathwatch._operator.instruments import gcpauses
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.instruments.supervisor import Supervisor
from deathwatch._operator.memory.deathwatches import Revised
from deathwatch._operator.process import startup
from deathwatch._operator.process.assembly import Parts
from deathwatch._operator.process.config import Config
from deathwatch._operator.sources import readiness
from deathwatch._operator.sources.readiness import Readiness, Streams

log = structlog.get_logger("deathwatch.app")


class App:
    def __init__(self, config: Config, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.supervisor = Supervisor(self.metrics)
        self.readiness = Readiness()
        self.streams = Streams(config.stream_stale_after)
        self.heartbeat = Heartbeat(file=config.heartbeat_file)
        self.parts: Parts | None = None
        self.started = False
        self.listening = False
        self.gc_pauses: gcpauses.PauseLog | None = None

    def build(self) -> Parts:
        """Every part once (assembly.py); a second call returns the same parts."""
        if self.parts is None:
            self.gc_pauses = gcpauses.install(self.metrics)
            self.parts = Parts(self.config, self.metrics, supervisor=self.supervisor,
                               readiness=self.readiness, streams=self.streams,
                               heartbeat=self.heartbeat, readyz=self.readyz)  # fmt: skip
        return self.parts

    async def start(self) -> None:
        """kopf's start-up handler: returns once verdicts, DeathWatches and pods are listed.
        A failing list is retried by its reflector (counted, logged); /healthz answers
        meanwhile. In order (startup.py): the ports, the shard's epoch, the listings, the
        writers, the election, the timed loops. A start-up kopf retries starts only what did
        not start."""
        parts = self.build()
        await self._listen(parts)
        if self.started:
            return
        await startup.learn_epoch(parts)  # raises if it cannot: kopf retries, logged
        self.started = True
        await startup.list_all(parts, adopt=self._adopt)
        await startup.begin_writing(parts)
        await startup.begin_election(parts)
        startup.start_timers(parts)
        log.info("started", tracked=len(parts.core.records),
                 namespaces=list(self.config.namespaces) or "all")  # fmt: skip

    async def _listen(self, parts: Parts) -> None:
        """The ports and the heartbeat, once, before anything is listed."""
        if self.listening:
            return
        await parts.endpoints.start()
        self.listening = True
        self.supervisor.start("heartbeat", lambda: self.heartbeat.beating(self._pulse))
        if self.config.metrics_cert_dir is not None:
            self.supervisor.start("certificates", parts.endpoints.certificates)

    async def stop(self) -> None:
        """SIGTERM: a leader finishes what it decided (bounded), stops writing, then releases
        the Lease so a standby takes over at its next try instead of after the lease runs out."""
        p = self.parts
        if p is not None:
            await _hand_over(p)
        await self.supervisor.stop()
        if self.gc_pauses is not None:
            gcpauses.uninstall(self.gc_pauses)
        if p is not None:
            if self.listening:
                await p.endpoints.stop()
            for client in p.rests:
                await client.close()

    def _adopt(self, change: Revised) -> None:
        """A DeathWatch new or selecting differently: its namespace's pods listed (bounded
        retries, every failure logged: adoption.py), beside the watches."""
        if self.parts is None:  # never: only the built parts' receivers call it
            return
        failed = "a deathwatch's pods not adopted; each pod's next event adopts it"
        self.supervisor.spawn("adopt", self.parts.adoption.adopt(change), failed)

    def _pulse(self) -> tuple[tuple[str, ...], bool]:
        """What the health port says, once a second: the tasks that keep crashing, and
        whether the controller is ready."""
        failing = tuple(f"{n}: {e}"[:200] for n, e in self.supervisor.failing().items())
        return failing, self.readyz()[0]

    def readyz(self) -> tuple[bool, dict[str, Any]]:
        """/readyz, from what the parts keep (readiness.py); before the build, only the
        process's own."""
        p, sup = self.parts, self.supervisor

        def parts() -> dict[str, Any]:
            elector = p.elector if p is not None else None
            return {
                "firewall": p.core.firewall.reading if p else None,
                "task_restarts": {n: t.restarts for n, t in sup.tasks.items()},
                "failing_tasks": sup.failing(),
                "pods_with_failing_policy": p.core.records.failing if p else 0,
                "leader": elector.status() if elector else {"leader_election": "off"},
                "releases": _releases(p),
                **_shard_status(p),
                "tracked": len(p.core.records) if p else 0,
                "write_backlog": p.writer.backlog if p else 0,
            }

        return readiness.report(self.readiness, self.streams, parts)


async def _hand_over(p: Parts) -> None:
    """What is owed stays owed, what was decided is written (bounded), writing stops, and the
    election ends before the Lease is released: a renewal sent after the release would take it
    back (seen: a release's PUT refused 409, the loop's renewal 21 ms later taken)."""
    if p.sender is not None:
        await p.sender.close()  # what is in flight stays owed: the next leader sends it
    if p.leadership.leading:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(p.writer.idle(), 10)
        p.leadership.standby("shutting down: stopped writing")
    if p.elector is not None:
        await p.supervisor.cancel("leader-election", "lease-watch", "shard-slots")
        await p.elector.release()


def _releases(p: Parts | None) -> dict[str, Any] | None:
    """What another release shares with this one (ADR 0038); None: not checked."""
    if p is None or p.rivals is None:
        return None
    rivals = p.rivals
    return {"refused": rivals.refusal(), "collisions": rivals.messages(), "read": rivals.read,
            "error": rivals.error}  # fmt: skip


def _shard_status(p: Parts | None) -> dict[str, Any]:
    if p is None or not p.config.shard.sharded:
        return {}
    filtered = [r.server_filtered for r in p.streams.pods]
    return {"shard": {**p.ownership.status(), "server_filtered": filtered}}
