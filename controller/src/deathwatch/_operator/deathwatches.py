"""The DeathWatches this controller serves, each compiled once per (uid, generation).

One registry serves both sides: the DeathWatch handler (`update`: what changed, and whether
its pods must be listed) and the pod path (`owner`: which DeathWatch judges a pod). A
DeathWatch is compared by its key and its revision (uid, generation), never by identity:
two readings of one revision are the same DeathWatch (issue #23: a second reading made a
second object, and an adoption that compared by identity adopted nothing).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from deathwatch._engine.podview import PodView
from deathwatch._operator.resources import Condition, DeathWatchKey
from deathwatch._operator.rules import Rules, SpecError, read_deathwatch
from deathwatch._policies import PolicyRegistry

log = structlog.get_logger("deathwatch.deathwatches")
Revision = tuple[str, int | None]  # (uid, generation): which DeathWatch, which edit of it


@dataclass(frozen=True, slots=True)
class Change:
    key: DeathWatchKey
    rules: Rules | None  # None: it cannot be used (`invalid` says why)
    select: bool  # new, or its selection changed: the pods it selects must be listed


class DeathWatches:
    def __init__(self, registry: PolicyRegistry) -> None:
        self.registry = registry
        self._rules: dict[DeathWatchKey, Rules] = {}
        self._by_namespace: dict[str, list[Rules]] = {}  # oldest first: the oldest wins a pod
        self._revisions: dict[DeathWatchKey, Revision] = {}
        self.invalid: dict[DeathWatchKey, str] = {}  # DeathWatch -> why it cannot be used
        # the conditions as last published: transition times carry over a restart
        self.conditions: dict[DeathWatchKey, list[Condition]] = {}

    def __iter__(self) -> Iterator[DeathWatchKey]:
        """Every DeathWatch there is a status to publish for, valid or not."""
        return iter(self._revisions)

    def get(self, key: DeathWatchKey) -> Rules | None:
        return self._rules.get(key)

    def current(self, key: DeathWatchKey, revision: Revision) -> Rules | None:
        """The DeathWatch at `key` if it is still at `revision` (not replaced, not gone)."""
        rules = self._rules.get(key)
        return rules if rules is not None and rules.revision == revision else None

    def owner(self, pod: PodView) -> Rules | None:
        """The DeathWatch that judges a pod: the oldest in its namespace that selects it."""
        for rules in self._by_namespace.get(pod.namespace, ()):
            if rules.selects(pod):
                return rules
        return None

    def compiled(self, key: DeathWatchKey, revision: Revision) -> bool:
        """Whether this revision of the DeathWatch at `key` was read already (valid or not):
        an event of it that is not a new revision changes nothing here."""
        return self._revisions.get(key) == revision

    def update(self, body: Mapping[str, Any]) -> Change | None:
        """A DeathWatch as listed or watched. None when its revision is the one already
        compiled (its own status write coming back)."""
        meta = body.get("metadata") or {}
        key: DeathWatchKey = (meta.get("namespace") or "default", meta.get("name") or "")
        generation = meta.get("generation")
        revision: Revision = (
            str(meta.get("uid") or ""),
            generation if isinstance(generation, int) else None,
        )
        if key not in self.conditions:
            try:
                published = (body.get("status") or {}).get("conditions") or []
                self.conditions[key] = msgspec.convert(published, list[Condition])
            except (msgspec.ValidationError, AttributeError):
                self.conditions[key] = []
        if self._revisions.get(key) == revision:
            return None
        before = self._rules.get(key)
        self._revisions[key] = revision
        try:
            rules = read_deathwatch(body, self.registry)
        except SpecError as exc:
            log.error("deathwatch invalid", namespace=key[0], deathwatch=key[1], error=str(exc))
            self.invalid[key] = str(exc)
            self._set(key, None)
            return Change(key, None, select=False)
        self.invalid.pop(key, None)
        self._set(key, rules)
        select = (
            before is None
            or before.selector != rules.selector
            or before.sandboxes != rules.sandboxes
            or before.uid != rules.uid
        )
        return Change(key, rules, select)

    def remove(self, key: DeathWatchKey) -> bool:
        known = key in self._revisions
        self._revisions.pop(key, None)
        self.invalid.pop(key, None)
        self.conditions.pop(key, None)
        self._set(key, None)
        return known

    def _set(self, key: DeathWatchKey, rules: Rules | None) -> None:
        if rules is None:
            self._rules.pop(key, None)
        else:
            self._rules[key] = rules
        members = [w for w in self._rules.values() if w.namespace == key[0]]
        if members:
            self._by_namespace[key[0]] = sorted(members, key=Rules.sort_key)
        else:
            self._by_namespace.pop(key[0], None)
