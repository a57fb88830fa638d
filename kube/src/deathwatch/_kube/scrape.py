"""The metrics page, rendered so that no number of scrapes can hold up the process's work.

- Rendered in a worker thread (prometheus_client's metrics are safe to read from one), never
  on the event loop;
- reused for `reuse` seconds: any number of scrapes within that window share one render;
- one render at a time, and at most `waiting` requests waiting for it; any further request
  is refused at once (503), as is one whose own deadline cannot be met: Prometheus says how
  long it will wait (`X-Prometheus-Scrape-Timeout-Seconds`), and an answer after that is
  work for nobody.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

TIMEOUT_HEADER: Final = "x-prometheus-scrape-timeout-seconds"
MARGIN: Final = 0.25  # seconds kept from the scraper's timeout for the answer's way back


def deadline_of(header: str | None, default: float) -> float:
    """How long a scrape may wait for its answer: the scraper's timeout, less a margin."""
    try:
        said = float(header) if header else default
    except ValueError:
        said = default
    if not said > 0:  # nan, negative, zero: as if not said
        said = default
    return max(0.05, min(said, default) - MARGIN)


class Scrapes:
    def __init__(
        self,
        render: Callable[[], bytes],
        *,
        reuse: float = 1.0,
        waiting: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.render, self.reuse, self.waiting, self.clock = render, reuse, waiting, clock
        self._page: bytes | None = None
        self._at = 0.0
        self._rendering: asyncio.Future[bytes] | None = None
        self._waiters = 0
        self.renders = 0
        self.refused = 0

    async def page(self, within: float) -> bytes | None:
        """The page, rendered at most `reuse` seconds ago; None: refused (busy, or not in
        `within` seconds)."""
        if self._page is not None and self.clock() - self._at < self.reuse:
            return self._page
        if self._rendering is None:
            self._rendering = asyncio.ensure_future(self._render())
        elif self._waiters >= self.waiting:
            self.refused += 1
            return None
        self._waiters += 1
        try:
            return await asyncio.wait_for(asyncio.shield(self._rendering), within)
        except TimeoutError:
            self.refused += 1
            return None
        finally:
            self._waiters -= 1

    async def _render(self) -> bytes:
        try:
            page = await asyncio.to_thread(self.render)
            self.renders += 1
            self._page, self._at = page, self.clock()
            return page
        finally:
            self._rendering = None
