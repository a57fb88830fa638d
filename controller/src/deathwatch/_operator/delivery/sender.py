"""The delivery shell: one loop per sink (supervised by the app), each attempt a task of its
own, over an HTTP session of the sink's own (its TLS trust, its connection limit), so that a
slow or dead receiver holds up nothing but its own events: not the verdicts (the writer is
apart), not another sink.

Only the leader sends: a loop waits while this replica stands by, checks that it may still
write right before each request, and a replica that stops leading cancels what it has in
flight (its outcome unknown, it stays owed: the next leader sends it again, the same id).
Each attempt has the sink's deadline (at most 30 s), follows no redirect, and reads at most
64 KiB of the answer. The outcome goes back to the controller (`report`), which records it on
the verdict (the writer, fenced); the outbox keeps order and the sink's backoff.

An event can reach its receiver a few milliseconds before its verdict's write does (the two
go out side by side; 7-12 ms, measured on a real API server): the event carries the whole
verdict as it was judged, so a receiver needs no read; one that reads the SandboxVerdict on
receipt may find the state before (docs/delivery.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import aiohttp
import structlog

from deathwatch._api.resources import DeliveryMark, DeliveryOutcome
from deathwatch._kube.configfile import ConfigError
from deathwatch._operator.delivery import config as sink_config
from deathwatch._operator.delivery.events import Answer, Outcome, Outgoing, read_answer, request
from deathwatch._operator.delivery.outbox import Deliveries, Ended, Owed, SinkOutbox
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.leadership.group import Leadership

log = structlog.get_logger("deathwatch.delivery")
READ_LIMIT = 64 * 1024  # of a receiver's answer: enough for its error, never its whole body


Compose = Callable[[str, str, Owed], Outgoing | None]  # (uid, sink, owed) -> the event now
Report = Callable[[Ended], None]


class Sender:
    def __init__(
        self,
        deliveries: Deliveries,
        compose: Compose,
        report: Report,
        metrics: Metrics,
        *,
        leadership: Leadership,
        user_agent: str,
        clock: Callable[[], datetime],
        rand: Callable[[], float] = random.random,
        sendable: Callable[[str], bool] | None = None,
    ) -> None:
        """`leadership`: whether this replica sends, followed (`lead`, `standby`) and asked
        right before each request; `sendable(uid)`: sharded, whether this shard writes that
        sandbox's slot now."""
        self.deliveries, self.compose, self.report = deliveries, compose, report
        self.metrics, self.leadership, self.user_agent = metrics, leadership, user_agent
        self.clock, self.rand, self.sendable = clock, rand, sendable
        self.wake = deliveries.wake  # something became owed, or an attempt ended
        self._attempts: set[asyncio.Task[None]] = set()
        self._sessions: dict[str, tuple[aiohttp.ClientSession, float | None]] = {}
        self._broken: dict[str, str] = {}  # sink -> why its keys cannot be used (said once)

    # --- leading --------------------------------------------------------------------------

    def lead(self, term: int | None = None) -> None:
        """What the old leader left undelivered, then what comes."""
        self.wake.set()

    def standby(self) -> None:
        """Stop sending: what is in flight is cancelled and stays owed."""
        for task in list(self._attempts):
            task.cancel()
        for box in self.deliveries.sinks.values():
            box.abandoned()

    async def close(self) -> None:
        self.standby()
        for session, _ in self._sessions.values():
            await session.close()
        self._sessions.clear()

    # --- the loops ------------------------------------------------------------------------

    async def run(self, name: str) -> None:
        """One sink's loop, for ever (supervised): take what is owed, oldest first, as the
        sink's concurrency and backoff allow."""
        box = self.deliveries.sinks[name]
        await self._session(box)  # made now, not on the first death's path
        while True:
            await self.leadership.wait()
            taken = box.take(time.monotonic(), self.sendable)
            if taken is None:
                # nothing to take now: until the pause ends, or something changes (a new
                # debt, an attempt ended, a slot gained); 0 here means what is ready is
                # another shard's for now
                wait = box.wait(time.monotonic())
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait or 5.0):
                        await self.wake.wait()
                continue
            uid, owed = taken
            task = asyncio.create_task(self._attempt(box, uid, owed), name=f"deliver-{name}")
            self._attempts.add(task)
            task.add_done_callback(self._attempts.discard)

    async def _attempt(self, box: SinkOutbox, uid: str, owed: Owed) -> None:
        sink = box.sink
        try:
            out = self.compose(uid, sink.name, owed)
            if out is None:  # forgotten, or no longer wanted: nothing is owed
                box.drop(uid)
                box.inflight.pop(uid, None)
                return
            await self._send(box, uid, owed, out)
        except asyncio.CancelledError:
            box.put_back(uid)  # no longer the leader, or shutting down: owed again
            raise
        except Exception as exc:  # a bug of ours: said, counted, tried again later
            log.exception("delivery attempt failed on a bug", sink=sink.name, uid=uid)
            self._failed(box, uid, owed.sequence, None, "bug", f"{type(exc).__name__}: {exc}")
        finally:
            self.wake.set()

    async def _send(self, box: SinkOutbox, uid: str, owed: Owed, out: Outgoing) -> None:
        sink = box.sink
        try:
            keys = sink_config.keys(sink)
        except ConfigError as exc:
            if self._broken.get(sink.name) != str(exc):
                self._broken[sink.name] = str(exc)
                log.error("sink has no usable key: its events wait", sink=sink.name,
                          error=str(exc))  # fmt: skip
            self._failed(box, uid, out.sequence, None, "keys", str(exc))
            return
        self._broken.pop(sink.name, None)
        headers, body = request(out, sink.mode, keys, int(time.time()), self.user_agent)
        if not self.leadership.leading or not self.leadership.may_write():
            box.put_back(uid)  # fenced between take and now: owed again, by the next leader
            return
        session = await self._session(box)
        answer: Answer | None = None
        deadline = aiohttp.ClientTimeout(total=sink.timeout)
        try:
            async with session.post(sink.url, data=body, headers=headers, allow_redirects=False,
                                    timeout=deadline) as resp:  # fmt: skip
                said = (await resp.content.read(READ_LIMIT)).decode("utf-8", "replace")
                answer = read_answer(resp.status, resp.headers, self.clock())
        except TimeoutError:
            self._failed(box, uid, out.sequence, None, "timeout",
                         f"no answer within {sink.timeout:.0f}s")  # fmt: skip
            return
        except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
            self._failed(box, uid, out.sequence, None, "tls", str(exc)[:200])
            return
        except (aiohttp.ClientError, OSError) as exc:
            self._failed(box, uid, out.sequence, None, "connection",
                         f"{type(exc).__name__}: {exc}"[:200])  # fmt: skip
            return
        if answer.outcome is Outcome.RETRY:
            self._failed(box, uid, out.sequence, answer, answer.reason,
                         f"{answer.reason}: {said[:120]}".strip())  # fmt: skip
            return
        box.ended(uid, out.sequence)
        now = self.clock()
        if answer.outcome is Outcome.DELIVERED:
            self.metrics.delivery_events.labels(sink.name, "delivered").inc()
            self.metrics.delivery_latency.labels(sink.name).observe(
                max(0.0, (now - out.time).total_seconds())
            )
            mark = DeliveryMark(sink=sink.name, id=out.id, sequence=out.sequence, state=out.state,
                                outcome=DeliveryOutcome.DELIVERED, at=now)  # fmt: skip
        else:
            self.metrics.delivery_events.labels(sink.name, "refused").inc()
            log.error("event refused by the receiver: not sent again", sink=sink.name,
                      id=out.id, code=answer.reason, answer=said[:200])  # fmt: skip
            mark = DeliveryMark(sink=sink.name, id=out.id, sequence=out.sequence,
                                state=out.state, outcome=DeliveryOutcome.REFUSED, at=now,
                                code=int(answer.reason), message=said[:256] or None)  # fmt: skip
        self.report(Ended(uid, mark))

    def _failed(self, box: SinkOutbox, uid: str, sequence: int, answer: Answer | None,
                reason: str, error: str) -> None:  # fmt: skip
        first = box.failures == 0
        wait = box.failed(uid, sequence, answer, error, time.monotonic(), self.rand())
        self.metrics.delivery_retries.labels(box.sink.name, reason).inc()
        if first or box.failures % 20 == 0:  # a spell is said when it begins, then now and then
            log.warning("delivery failed, will retry", sink=box.sink.name, reason=reason,
                        error=error[:200], failures=box.failures, retry_in=round(wait, 2),
                        owed=len(box.owed), answered=answer is not None)  # fmt: skip

    async def _session(self, box: SinkOutbox) -> aiohttp.ClientSession:
        """The sink's session, made at start and again when its CA file changes (a rotated
        Secret)."""
        sink = box.sink
        ca = sink_config.ca_file(sink)
        stamp = _mtime(ca)
        current = self._sessions.get(sink.name)
        if current is not None and current[1] == stamp:
            return current[0]
        if current is not None:
            await current[0].close()
        # loading the system's CA bundle takes ~20 ms here: in a thread (OpenSSL releases
        # the GIL), never on the event loop, where it held the first death's verdict back
        context = await asyncio.to_thread(
            ssl.create_default_context, cafile=str(ca) if ca else None
        )  # fmt: skip
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=sink.concurrency, ssl=context,
                                           ttl_dns_cache=10, enable_cleanup_closed=True),
            auto_decompress=False,
        )  # fmt: skip
        self._sessions[sink.name] = (session, stamp)
        return session


def _mtime(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        return path.stat().st_mtime
    except OSError:
        return None
