"""What owns the verdicts, on their own watches: DeathWatches (compiled into
`Rules`, a deleted one forgetting its sandboxes, a sharded one's other parts kept for shard 0's
sums) and agent-sandbox Sandboxes (what their pods' verdicts name). The pass's methods, on
what it uses (`OwnerPass`); no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import structlog

from deathwatch._api.agent_sandbox import SandboxObject
from deathwatch._api.objects import DeathWatchObject, EventType
from deathwatch._api.resources import DW_PLURAL, DeathWatchKey, ShardPart
from deathwatch._operator.memory.agent_sandboxes import AgentSandboxes
from deathwatch._operator.memory.deathwatches import DeathWatches, Revised
from deathwatch._operator.memory.records import Records
from deathwatch._operator.passes.tail import Tail
from deathwatch._operator.reporting.summary import Summaries
from deathwatch._operator.shards.filter import ShardFilter
from deathwatch._operator.writing.writer import Writer

log = structlog.get_logger("deathwatch.controller")


@dataclass(frozen=True, slots=True)
class OwnerPass:
    """What the owners' pass uses: the DeathWatches and the records they own, their counts,
    agent-sandbox's Sandboxes, the shard filter (a sharded status's parts), the writer (what
    the API holds of a DeathWatch's status), and the tail."""

    deathwatches: DeathWatches
    records: Records
    summaries: Summaries
    agent_sandboxes: AgentSandboxes
    shards: ShardFilter
    writer: Writer
    tail: Tail

    def on_deathwatch(self, kind: EventType, dw: DeathWatchObject) -> Revised | None:
        """A DeathWatch event. Returns the change when its pods must be listed and adopted (it is
        new or selects differently: no pod event will tell of the pods it now selects, and the
        controller keeps no copy of pods that are not sandboxes). Most events are status writes
        (its own, another shard's): their spec is the revision compiled already, so only the
        status is read, and only what this process needs of it."""
        key = dw.key
        if kind is EventType.DELETED or dw.deleting:
            self.drop_deathwatch(key)
            return None
        if dw.controller != self.deathwatches.controller_id:
            # another controller's: what it selects is kept (the oldest DeathWatch wins a pod,
            # whoever serves it), nothing else; had it been this controller's, its sandboxes go
            revision = (dw.uid, dw.generation)
            known = self.deathwatches.foreign_compiled(key, revision, dw.controller)
            if self.deathwatches.foreign(
                key, revision, dw.controller, None if known else dw.body()
            ):
                self._forget_sandboxes(key)
            elif not known:
                self._forget_sandboxes(key)  # restored from its verdicts before it was listed
            return None
        if not self.shards.sharded:
            status = msgspec.json.decode(dw.status)
            self.writer.observed(DW_PLURAL, *key, status if isinstance(status, dict) else {},
                                 dw.version)  # fmt: skip
        elif self.shards.spec.index == 0:  # parts applied, not replaced; only shard 0 sums them
            self.keep_parts(key, dw.status)
        if self.deathwatches.compiled(key, (dw.uid, dw.generation)):
            return None  # a status write: the spec is the revision compiled already
        change = self.deathwatches.update(dw.body())
        if change is None:
            return None
        if change.rules is not None:
            # restored records wait for their DeathWatch's settings (their window multiplier,
            # their agent ports): from now on they are judged with them
            for record in self.records.of_deathwatch(key):
                if record.memory is not None:
                    record.memory.settings = change.rules.settings
        return change if change.rules is not None and change.select else None

    def keep_parts(self, key: DeathWatchKey, status: msgspec.Raw) -> None:
        """The other shards' parts of a DeathWatch's status, as they wrote them (shard 0 sums
        them). A status it cannot read leaves the parts as they were."""
        try:
            parts = _parts(status)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return
        index = self.shards.spec.index
        self.shards.parts[key] = {
            part.shard: part for part in (parts.shards if parts else []) if part.shard != index
        }

    def deathwatches_listed(self, scope: str | None, seen: set[DeathWatchKey]) -> None:
        """A complete listing of `scope` (a namespace; None: all) showed `seen`: the others
        were deleted while the watch was down."""
        gone = [key for key in self.deathwatches
                if (scope is None or key[0] == scope) and key not in seen]  # fmt: skip
        for key in gone:
            log.info("deathwatch deleted while unwatched", namespace=key[0], deathwatch=key[1])
            self.drop_deathwatch(key)
        log.info("deathwatches listed", scope=scope or "all", count=len(seen))

    def sandboxes_listed(self, scope: str | None, seen: set[tuple[str, str]]) -> None:
        """A complete listing of agent-sandbox's Sandboxes in `scope` showed `seen`: the
        others were deleted while the watch was down."""
        self.agent_sandboxes.relisted(scope, seen)
        log.info("agent-sandbox Sandboxes listed", scope=scope or "all", count=len(seen))

    def drop_deathwatch(self, key: DeathWatchKey) -> None:
        """The DeathWatch is gone: its verdicts go with it (ownerReferences), so does the
        controller's memory of them."""
        if not self.deathwatches.remove(key):
            return
        self._forget_sandboxes(key)

    def _forget_sandboxes(self, key: DeathWatchKey) -> None:
        """Nothing of this DeathWatch is this controller's: its verdicts (they go with it, or its
        own controller writes them) and the controller's memory of them."""
        for record in self.records.of_deathwatch(key):
            self.tail.forget(record)
            self.writer.forget(*record.verdict)
        self.summaries.drop(key)
        self.writer.forget(DW_PLURAL, *key)

    def on_agent_sandbox(self, kind: EventType, obj: SandboxObject) -> None:
        """A Sandbox as its watch shows it. When what its verdicts name changes (a claim adopted
        it from its warm pool), each of its pods' verdicts says so: same verdict, same pod uid,
        and now its claim."""
        if kind is EventType.DELETED:
            self.agent_sandboxes.remove(obj.namespace, obj.name)
            return
        if not self.agent_sandboxes.update(obj):
            return
        for record in self.records.of_agent_sandbox(obj.namespace, obj.name):
            track = record.track
            rules = self.deathwatches.get(record.deathwatch)
            if track is not None and rules is not None and record.persisted:
                self.writer.want(self.tail.verdict(track, record, rules))


class _Parts(msgspec.Struct):
    shards: list[ShardPart] = msgspec.field(default_factory=list)


_parts = msgspec.json.Decoder(_Parts | None).decode
