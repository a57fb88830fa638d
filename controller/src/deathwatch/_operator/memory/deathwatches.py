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

from deathwatch._api.resources import Condition, DeathWatchKey
from deathwatch._api.rules import Rules, SpecError, read_deathwatch
from deathwatch._engine.podview import PodView
from deathwatch._policies import PolicyRegistry

log = structlog.get_logger("deathwatch.deathwatches")
Revision = tuple[str, int | None]  # (uid, generation): which DeathWatch, which edit of it


@dataclass(frozen=True, slots=True)
class Revised:
    """A DeathWatch compiled anew (created, or its spec edited)."""

    key: DeathWatchKey
    rules: Rules | None  # None: it cannot be used (`invalid` says why)
    select: bool  # new, or its selection changed: the pods it selects must be listed


class DeathWatches:
    def __init__(self, registry: PolicyRegistry, controller_id: str = "") -> None:
        self.registry = registry
        self.controller_id = controller_id  # serves the DeathWatches annotated with it
        self._rules: dict[DeathWatchKey, Rules] = {}
        self._by_namespace: dict[str, list[Rules]] = {}  # oldest first: the oldest wins a pod
        self._revisions: dict[DeathWatchKey, Revision] = {}
        # another controller's DeathWatches (another controller id): what they select, so a
        # pod the oldest of them selects first is left to that controller
        self._foreign: dict[DeathWatchKey, Rules] = {}
        self._foreign_revisions: dict[DeathWatchKey, tuple[Revision, str]] = {}
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
        """The DeathWatch that judges a pod: the oldest in its namespace that selects it, if
        it is this controller's (another controller's: that one judges it)."""
        for rules in self._by_namespace.get(pod.namespace, ()):
            if rules.selects(pod):
                return None if rules.key in self._foreign else rules
        return None

    def foreign(self, key: DeathWatchKey, revision: Revision, controller: str,
                body: Mapping[str, Any] | None) -> bool:  # fmt: skip
        """Another controller's DeathWatch (`controller`: its controller id), as listed or
        watched (`body` None: the revision known already). What it selects is kept, for
        `owner`; nothing else of it. True when it was this controller's until now."""
        mine = key in self._revisions
        if mine:  # moved to another controller: nothing of it is this one's any more
            self._revisions.pop(key, None)
            self.invalid.pop(key, None)
            self.conditions.pop(key, None)
            self._rules.pop(key, None)
            self._place(key[0])
        if self._foreign_revisions.get(key) == (revision, controller) or body is None:
            return mine
        self._foreign_revisions[key] = (revision, controller)
        try:  # its selection only: its policy may be a plugin installed there, not here
            spec = {**(body.get("spec") or {}), "policy": "auto"}
            rules = read_deathwatch({**body, "spec": spec}, self.registry)
        except SpecError:
            self._foreign.pop(key, None)  # unreadable: its own controller says why
        else:
            self._foreign[key] = rules
        self._place(key[0])
        return mine

    def foreign_compiled(self, key: DeathWatchKey, revision: Revision, controller: str) -> bool:
        return self._foreign_revisions.get(key) == (revision, controller)

    def compiled(self, key: DeathWatchKey, revision: Revision) -> bool:
        """Whether this revision of the DeathWatch at `key` was read already (valid or not):
        an event of it that is not a new revision changes nothing here."""
        return self._revisions.get(key) == revision

    def update(self, body: Mapping[str, Any]) -> Revised | None:
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
            return Revised(key, None, select=False)
        self.invalid.pop(key, None)
        self._set(key, rules)
        select = (
            before is None
            or before.selector != rules.selector
            or before.sandboxes != rules.sandboxes
            or before.uid != rules.uid
        )
        return Revised(key, rules, select)

    def remove(self, key: DeathWatchKey) -> bool:
        """Forget the DeathWatch at `key`; whether it was this controller's."""
        known = key in self._revisions
        self._foreign_revisions.pop(key, None)
        if self._foreign.pop(key, None) is not None:
            self._place(key[0])
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
        self._place(key[0])

    def _place(self, namespace: str) -> None:
        """A namespace's DeathWatches, this controller's and others', oldest first."""
        key = (namespace, "")
        members = [w for w in (*self._rules.values(), *self._foreign.values())
                   if w.namespace == key[0]]  # fmt: skip
        if members:
            self._by_namespace[key[0]] = sorted(members, key=Rules.sort_key)
        else:
            self._by_namespace.pop(key[0], None)
