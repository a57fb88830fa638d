"""One-off listings: the pods of a new or changed DeathWatch's namespace, page by page
(nothing else would bring the pods it now selects: they have no event to come). On the
list/watch protocol (deathwatch._kube.listwatch), one listing each, retried with backoff a
bounded number of times, every failure counted and logged."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec
import structlog

from deathwatch._api.rest import Rest
from deathwatch._engine.podview import MalformedPod, PodView, decode_pod
from deathwatch._kube import backoff
from deathwatch._kube.errors import describe, label
from deathwatch._kube.listwatch import Item, ListWatch, Noted, outputs
from deathwatch._operator.instruments.metrics import Metrics
from deathwatch._operator.memory.deathwatches import DeathWatches, Revised
from deathwatch._operator.passes.pods import PodPass

log = structlog.get_logger("deathwatch.adoption")
INACTIVITY = 70.0  # never used by a listing (no watch), the transport's own


def _once(label_selector: str | None = None, shard_selector: str | None = None) -> ListWatch:
    return ListWatch(label_selector=label_selector, shard_selector=shard_selector, follow=False,
                     backoff=backoff.ADOPT, attempts=len(backoff.ADOPT) + 1)  # fmt: skip


class Adoption:
    def __init__(self, rest: Rest, pods: PodPass, deathwatches: DeathWatches, metrics: Metrics,
                 label_selector: str | None,
                 shard_selector: str | None = None) -> None:  # fmt: skip
        self.rest, self.pods, self.deathwatches, self.metrics = rest, pods, deathwatches, metrics
        self.label_selector = label_selector
        self.shard_selector = shard_selector

    async def adopt(self, change: Revised) -> None:
        """List the pods of a new or changed DeathWatch's namespace, page by page, and hand
        them to the pod pass, until done or until the DeathWatch changes again (its newer
        revision's own listing takes over)."""
        rules = change.rules
        assert rules is not None  # noqa: S101 - only valid DeathWatches select
        namespace = rules.namespace
        transport = self.rest.transport(f"/api/v1/namespaces/{namespace}/pods", INACTIVITY)
        protocol = _once(self.label_selector, self.shard_selector)
        adopted = 0
        page: list[msgspec.Raw] = []
        versions: dict[str, str] = {}
        try:
            async for out in outputs(protocol, transport):
                if isinstance(out, Item):
                    page.append(out.raw)
                    if len(page) >= protocol.page_size:
                        adopted += self.pods.adopt(
                            rules.key,
                            rules.revision,
                            _views(page, versions),
                            versions,
                        )
                        page = []
                        if self.deathwatches.current(rules.key, rules.revision) is None:
                            return  # changed or gone meanwhile: its own listing adopts them
                elif isinstance(out, Noted) and out.error is not None:
                    self._failed("list_pods", out, namespace=namespace, deathwatch=rules.name)
            adopted += self.pods.adopt(rules.key, rules.revision, _views(page, versions), versions)
        except Exception as exc:
            log.error("pods of a deathwatch not listed; each pod's next event adopts it",
                      namespace=namespace, deathwatch=rules.name,
                      error=describe(exc)[:300])  # fmt: skip
            return
        log.info("deathwatch adopted existing pods", namespace=namespace,
                 deathwatch=rules.name, count=adopted)  # fmt: skip

    def _failed(self, operation: str, note: Noted, **where: str) -> None:
        assert note.error is not None  # noqa: S101 - called for failures only
        self.metrics.api_errors.labels(operation, label(note.error)).inc()
        log.error("listing failed, retrying", operation=operation, **where,
                  error=describe(note.error)[:300], retry_in=note.retry_in)  # fmt: skip


def _views(items: Iterable[msgspec.Raw], versions: dict[str, str]) -> Iterator[PodView]:
    """The pods of a listed page, each decoded once from its bytes; their resourceVersions
    noted in `versions` by uid."""
    for item in items:
        try:
            view, version = decode_pod(item)
        except MalformedPod:
            continue  # its own watch event reports it
        versions[view.uid] = version
        yield view
