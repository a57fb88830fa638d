"""One object written to the API as a desire asks: the write protocol, with its
preconditions, fencing and bounded retries (ADR 0011). A status is replaced whole with the
resourceVersion it was computed against and stamped with the writer's term; an object whose
version is unknown is read first; a 409 reads again and tries again, up to four times; a
verdict that exists and its Events go out together. What the API holds after each call is
kept in `held`, the dict the writer compares its desires with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import structlog

from deathwatch._api.resources import NOUNS
from deathwatch._kube.errors import ApiError, KubeError, label
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.writing.desired import Desired, ObjectKey
from deathwatch._operator.writing.status_writes import (
    EMPTY,
    NO_LABELS,
    TERM,
    Held,
    gist,
    label_gist,
    says_dead,
)

log = structlog.get_logger("deathwatch.writer")


class WriteApi(Protocol):
    """The writer's calls; each raises errors.ApiError on refusal, errors.NoAnswer when no
    answer came. `create`,
    `replace_status` and `patch_labels` return the object's new resourceVersion;
    `replace_status`, `patch_labels` and `delete` fail (409) if the object is no longer at
    `version`. `read_status` returns the status, the version and the labels."""

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> str: ...

    async def replace_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], version: str
    ) -> str: ...

    async def patch_labels(
        self, plural: str, namespace: str, name: str, labels: dict[str, str], version: str
    ) -> str: ...

    async def apply_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], manager: str
    ) -> str: ...

    async def delete(self, plural: str, namespace: str, name: str, version: str) -> None: ...

    async def read_status(
        self, plural: str, namespace: str, name: str
    ) -> tuple[dict[str, Any], str, dict[str, str]] | None: ...

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...


class Contended(KubeError):
    """The object moved under every bounded try: written again after a backoff."""

    @property
    def retryable(self) -> bool:
        return True

    @property
    def label(self) -> str:
        return "contended"


class ObjectWrites:
    def __init__(
        self,
        api: WriteApi,
        metrics: Metrics,
        held: dict[ObjectKey, Held],
        *,
        check: Callable[[int | None], None],
        term: Callable[[], int],
        clock: Callable[[], datetime],
        instance: str,
    ) -> None:
        """`held`: what the API holds, shared with the writer; `check(slot)` raises Fenced
        unless this replica may send for `slot` now, asked right before every call; `term()`:
        the term stamped on every status; `instance`: the Events' reporting instance."""
        self.api, self.metrics, self.held = api, metrics, held
        self.check, self.term, self.clock, self.instance = check, term, clock, instance

    async def _call(self, operation: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            result = await fn(*args)
        except Exception as exc:
            self.metrics.api_errors.labels(operation, label(exc)).inc()
            raise
        self.metrics.api_writes.labels(operation).inc()
        return result

    async def write(self, d: Desired) -> None:
        held = self.held.get(d.key)
        says = d.says and not d.held_by(held)
        if d.delete is not None:
            await self._post_all(d)
            await self._delete(d, d.delete)
        elif says and d.events and held is not None:
            # the verdict and its Events at once: saying "dead" costs one round trip
            results = await asyncio.gather(
                self._write_status(d), self._post_all(d), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    raise result
        else:
            await self._post_all(d)  # before a verdict that must still be created
            if says:
                await self._write_status(d)

    async def _post_all(self, d: Desired) -> None:
        failure: BaseException | None = None
        for event in list(d.events):
            try:
                self.check(d.slot)
                await self._call(
                    "create_event", self.api.create_event, event.namespace,
                    event.document(self.clock(), self.instance),
                )  # fmt: skip
            except Exception as exc:
                if not (isinstance(exc, ApiError) and exc.conflict):  # 409: posted before, once
                    failure = failure or exc
                    continue
            d.events.remove(event)  # posted: a retry of the rest must not repeat it
        if failure is not None:
            raise failure

    async def _read(self, d: Desired) -> tuple[Held, Mapping[str, Any]] | None:
        """What the API holds now (None: the object does not exist)."""
        current = await self._call(
            f"read_{NOUNS[d.plural]}_status", self.api.read_status, d.plural, d.namespace, d.name
        )
        if current is None:
            self.held.pop(d.key, None)
            return None
        status, version, labels = current
        held = self.held[d.key] = Held(gist(status), version, label_gist(labels), says_dead(status))
        return held, status

    async def _write_status(self, d: Desired) -> None:
        """The status, then the written labels (a verdict's origin): two writes, each with
        the version it was computed against; the status first, because it is the verdict."""
        assert d.status is not None  # noqa: S101 - called only for a status
        key, noun = d.key, NOUNS[d.plural]
        if d.apply_as is not None:
            self.check(d.slot)
            version = await self._call(f"apply_{noun}_status", self.api.apply_status, d.plural,
                                       d.namespace, d.name, d.status, d.apply_as)  # fmt: skip
            self.held[key] = Held(d.gist, version)
            return
        for attempt in range(4):  # created, conflicted or vanished meanwhile: try again, bounded
            held = self.held.get(key)
            if held is None and attempt == 0 and d.create is None:
                read = await self._read(d)  # never seen: its version first, never a blind write
                held = read[0] if read else None
            if held is None:
                if d.create is None:
                    return  # a DeathWatch that is gone: nothing to report on
                self.check(d.slot)
                try:
                    version = await self._call(
                        f"create_{noun}", self.api.create, d.plural, d.namespace, d.create
                    )
                except Exception as exc:
                    if not (isinstance(exc, ApiError) and exc.conflict):
                        raise
                    await self._read(d)  # exists after all: write on what it holds
                    continue
                created = label_gist(d.create.get("metadata", {}).get("labels"))
                held = self.held[key] = Held(EMPTY, version, created)
            if held.gist != d.gist:
                self.check(d.slot)
                sent = time.monotonic()
                try:
                    version = await self._call(
                        f"replace_{noun}_status", self.api.replace_status, d.plural,
                        d.namespace, d.name, {**d.status, TERM: self.term()}, held.version,
                    )  # fmt: skip
                except Exception as exc:
                    if await self._conflicted(d, exc):
                        continue
                    raise
                was_dead = held.dead
                held = self.held[key] = Held(d.gist, version, held.labels, says_dead(d.status))
                self._written(d, was_dead, sent)
            if d.labels is not None and held.labels != d.label_gist:
                self.check(d.slot)
                try:
                    version = await self._call(
                        f"label_{noun}", self.api.patch_labels, d.plural, d.namespace, d.name,
                        d.labels, held.version,
                    )  # fmt: skip
                except Exception as exc:
                    if await self._conflicted(d, exc):
                        continue
                    raise
                wanted = d.label_gist if d.label_gist is not None else NO_LABELS
                self.held[key] = Held(held.gist, version, wanted, held.dead)
            return
        raise Contended(f"{d.plural} {d.namespace}/{d.name}: changed under every try")

    async def _conflicted(self, d: Desired, exc: Exception) -> bool:
        """A write refused because the object moved: True when it is worth another try."""
        if not isinstance(exc, ApiError):
            return False
        if exc.conflict:  # written meanwhile (another term): re-read, re-compare
            await self._read(d)
            return True
        if exc.not_found:  # deleted behind our back: create it again, or drop it
            self.held.pop(d.key, None)
            return True
        return False

    def _written(self, d: Desired, was_dead: bool, sent: float) -> None:
        """A status written: a verdict's latency observed the once the API first holds it
        Dead (not again when a Dead verdict is written again: its pod's deletion time, a
        takeover's rewrite), and said with its share of the path (the benches read it)."""
        if not was_dead and d.ready_drop_at is not None and says_dead(d.status):
            latency = (self.clock() - d.ready_drop_at).total_seconds()
            self.metrics.verdict_latency.observe(max(0.0, latency))
            if d.received is not None:
                now = time.monotonic()
                self.metrics.processing_latency.observe(now - d.received)
                log.info("dead verdict written", namespace=d.namespace, name=d.name,
                         received_ms=round((now - d.received) * 1e3, 1),
                         queued_ms=round((sent - d.received) * 1e3, 1),
                         write_ms=round((now - sent) * 1e3, 1))  # fmt: skip

    async def _delete(self, d: Desired, uid: str) -> None:
        """Delete the verdict while it still is `uid`'s (a newer pod of the same name keeps
        its own), with the version it is known at as the precondition."""
        for attempt in range(3):
            held = self.held.get(d.key) if attempt == 0 else None
            if held is None:
                read = await self._read(d)
                if read is None:
                    return  # gone already
                held, status = read
                if status.get("podUID") not in (None, uid):
                    return  # a newer pod's verdict: it stays
            self.check(d.slot)
            try:
                await self._call(
                    "delete_verdict", self.api.delete, d.plural, d.namespace, d.name, held.version
                )
            except ApiError as exc:
                if exc.conflict:
                    continue  # changed meanwhile: look again at whose it is
                if not exc.not_found:
                    raise
            self.held.pop(d.key, None)
            return
        raise Contended(f"{d.plural} {d.namespace}/{d.name}: changed under every delete")
