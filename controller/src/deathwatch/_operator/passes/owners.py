"""What owns the verdicts, on their own watches: DeathWatches (compiled into
`Rules`, a deleted one forgetting its sandboxes, a sharded one's other parts kept for shard 0's
sums) and agent-sandbox Sandboxes (what their pods' verdicts name). Free functions on the
Core; no I/O.
"""

from __future__ import annotations

import msgspec

from deathwatch._api.agent_sandbox import SandboxObject
from deathwatch._api.objects import DeathWatchObject, EventType
from deathwatch._api.resources import DW_PLURAL, DeathWatchKey, ShardPart
from deathwatch._operator.memory.core import Core
from deathwatch._operator.memory.deathwatches import Change


def on_deathwatch(core: Core, kind: EventType, dw: DeathWatchObject) -> Change | None:
    """A DeathWatch event. Returns the change when its pods must be listed and adopted (it is
    new or selects differently: no pod event will tell of the pods it now selects, and the
    controller keeps no copy of pods that are not sandboxes). Most events are status writes
    (its own, another shard's): their spec is the revision compiled already, so only the
    status is read, and only what this process needs of it."""
    key = dw.key
    if kind is EventType.DELETED or dw.deleting:
        drop_deathwatch(core, key)
        return None
    if dw.controller != core.deathwatches.controller_id:
        # another controller's: what it selects is kept (the oldest DeathWatch wins a pod,
        # whoever serves it), nothing else; had it been this controller's, its sandboxes go
        revision = (dw.uid, dw.generation)
        known = core.deathwatches.foreign_compiled(key, revision, dw.controller)
        if core.deathwatches.foreign(key, revision, dw.controller, None if known else dw.body()):
            _forget_sandboxes(core, key)
        elif not known:
            _forget_sandboxes(core, key)  # restored from its verdicts before it was listed
        return None
    if not core.shards.sharded:
        status = msgspec.json.decode(dw.status)
        core.writer.observed(DW_PLURAL, *key, status if isinstance(status, dict) else {},
                             dw.version)  # fmt: skip
    elif core.shards.spec.index == 0:  # parts applied, not replaced; only shard 0 sums them
        keep_parts(core, key, dw.status)
    if core.deathwatches.compiled(key, (dw.uid, dw.generation)):
        return None  # a status write: the spec is the revision compiled already
    change = core.deathwatches.update(dw.body())
    if change is None:
        return None
    if change.rules is not None:
        # restored records wait for their DeathWatch's settings (their window multiplier,
        # their agent ports): from now on they are judged with them
        for record in core.records.of_deathwatch(key):
            if record.memory is not None:
                record.memory.settings = change.rules.settings
    return change if change.rules is not None and change.select else None


class _Parts(msgspec.Struct):
    shards: list[ShardPart] = msgspec.field(default_factory=list)


_parts = msgspec.json.Decoder(_Parts | None).decode


def keep_parts(core: Core, key: DeathWatchKey, status: msgspec.Raw) -> None:
    """The other shards' parts of a DeathWatch's status, as they wrote them (shard 0 sums
    them). A status it cannot read leaves the parts as they were."""
    try:
        parts = _parts(status)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return
    index = core.shards.spec.index
    core.shards.parts[key] = {
        p.shard: p for p in (parts.shards if parts else []) if p.shard != index
    }


def drop_deathwatch(core: Core, key: DeathWatchKey) -> None:
    """The DeathWatch is gone: its verdicts go with it (ownerReferences), so does the
    controller's memory of them."""
    if not core.deathwatches.remove(key):
        return
    _forget_sandboxes(core, key)


def _forget_sandboxes(core: Core, key: DeathWatchKey) -> None:
    """Nothing of this DeathWatch is this controller's: its verdicts (they go with it, or its
    own controller writes them) and the controller's memory of them."""
    for record in core.records.of_deathwatch(key):
        core.forget(record)
        core.writer.forget(*record.verdict)
    core.summaries.drop(key)
    core.writer.forget(DW_PLURAL, *key)


def on_agent_sandbox(core: Core, kind: EventType, obj: SandboxObject) -> None:
    """A Sandbox as its watch shows it. When what its verdicts name changes (a claim adopted
    it from its warm pool), each of its pods' verdicts says so: same verdict, same pod uid,
    and now its claim."""
    if kind is EventType.DELETED:
        core.agent_sandboxes.remove(obj.namespace, obj.name)
        return
    if not core.agent_sandboxes.update(obj):
        return
    for record in core.records.of_agent_sandbox(obj.namespace, obj.name):
        track = record.track
        rules = core.deathwatches.get(record.deathwatch)
        if track is not None and rules is not None and record.persisted:
            core.writer.want(core.verdict(track, record, rules))
