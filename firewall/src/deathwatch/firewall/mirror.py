"""A kind of object as last seen by the agent, kept current by the list/watch protocol.

One `Mirror` per kind the agent reads whole (Nodes: hosts.py; DeathWatches:
deathwatches.py): one list, then a watch resumed from its resourceVersion (a 410 lists
again), keeping of each object only what `keep` returns, and waking the agent on a change
to that. Failures are counted (`failed()`), logged and retried with backoff, never the end
of the thread: it never ends before the agent does. Until the first listing completes its
snapshot is None ("not known"), which is never the same as "none".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import structlog

from deathwatch._kube import backoff
from deathwatch._kube.errors import describe
from deathwatch._kube.listwatch import LISTED, Item, Listed, Listing, ListWatch, Noted, Output
from deathwatch.firewall.kubeapi import Api, ThreadTransport, follow

log = structlog.get_logger("deathwatch.firewall")
WATCH_SECONDS = 300
Kept = TypeVar("Kept")


class Mirror(Generic[Kept]):
    def __init__(
        self,
        api: Api,
        path: str,
        kind: str,
        keep: Callable[[Mapping[str, Any]], Kept],
        wake: Callable[[], None],
        failed: Callable[[], None],
        stop: threading.Event,
        label_selector: str | None = None,
    ) -> None:
        self.api, self.path, self.kind, self.keep = api, path, kind, keep
        self.label_selector = label_selector
        self.wake, self.failed, self.stop = wake, failed, stop
        self.objects: dict[str, Kept] = {}
        self.listed = False
        self._listing: dict[str, Kept] = {}
        self._lock = threading.Lock()

    def snapshot(self) -> list[Kept] | None:
        """The objects as last seen (None: never listed yet)."""
        with self._lock:
            return list(self.objects.values()) if self.listed else None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"{self.kind}-watch", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        transport = ThreadTransport(self.api, self.path, self.stop, WATCH_SECONDS + 30)
        while not self.stop.is_set():
            try:
                protocol = ListWatch(
                    label_selector=self.label_selector,
                    server_timeout=WATCH_SECONDS,
                    backoff=backoff.NODE_WATCH,
                )
                follow(protocol, transport, self._handle)
            except Exception:  # a bug: counted, logged with its traceback, started again
                self.failed()
                log.exception(f"{self.kind} watch failed; starting it again")
                self.stop.wait(backoff.NODE_WATCH[-1])

    def _handle(self, out: Output) -> bool:
        if isinstance(out, Item):
            obj = json.loads(bytes(out.raw))
            meta = obj.get("metadata") or {}
            key = f"{meta.get('namespace') or ''}/{meta.get('name')}"
            if out.type == LISTED:
                self._listing[key] = self.keep(obj)
                return True
            with self._lock:
                before = self.objects.get(key)
                if out.type == "DELETED":
                    self.objects.pop(key, None)
                else:
                    self.objects[key] = self.keep(obj)
                changed = self.objects.get(key) != before
            if changed:
                self.wake()
        elif isinstance(out, Listing):
            self._listing = {}
        elif isinstance(out, Listed):
            with self._lock:
                self.objects, self.listed = self._listing, True
            self._listing = {}
            self.wake()
        elif isinstance(out, Noted) and out.error is not None:
            self.failed()
            log.warning(f"{self.kind} watch failed; retrying", error=describe(out.error)[:300],
                        retry_in=out.retry_in)  # fmt: skip
        return True
