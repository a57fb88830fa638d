"""The DeathWatches this controller serves, each compiled once per (uid, generation).

One registry serves both sides: the DeathWatch handler (`update`: what changed, and whether
its pods must be listed) and the pod path (`owner`: which DeathWatch judges a pod). A
DeathWatch is compared by its key and its version (uid, generation), never by identity:
two readings of one version are the same DeathWatch (issue #23: a second reading made a
second object, and an adoption that compared by identity adopted nothing).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from deathwatch._engine.podview import PodView
from deathwatch._operator.resources import Condition
from deathwatch._operator.spec import SpecError, Watch, read_deathwatch
from deathwatch._policies import PolicyRegistry

log = structlog.get_logger("deathwatch.deathwatches")
Key = tuple[str, str]  # (namespace, name)
Version = tuple[str, int | None]  # (uid, generation)


@dataclass(frozen=True, slots=True)
class Change:
    key: Key
    watch: Watch | None  # None: it cannot be used (`invalid` says why)
    select: bool  # new, or its selection changed: the pods it selects must be listed


class DeathWatches:
    def __init__(self, registry: PolicyRegistry) -> None:
        self.registry = registry
        self._watches: dict[Key, Watch] = {}
        self._by_namespace: dict[str, list[Watch]] = {}  # oldest first: the oldest wins a pod
        self._versions: dict[Key, Version] = {}
        self.invalid: dict[Key, str] = {}  # DeathWatch -> why it cannot be used
        # the conditions as last published: transition times carry over a restart
        self.conditions: dict[Key, list[Condition]] = {}

    def __iter__(self) -> Iterator[Key]:
        """Every DeathWatch there is a status to publish for, valid or not."""
        return iter(self._versions)

    def get(self, key: Key) -> Watch | None:
        return self._watches.get(key)

    def current(self, key: Key, version: Version) -> Watch | None:
        """The DeathWatch at `key` if it is still at `version` (not replaced, not gone)."""
        watch = self._watches.get(key)
        return watch if watch is not None and watch.version == version else None

    def owner(self, pod: PodView) -> Watch | None:
        """The DeathWatch that judges a pod: the oldest in its namespace that selects it."""
        for watch in self._by_namespace.get(pod.namespace, ()):
            if watch.selects(pod):
                return watch
        return None

    def update(self, body: Mapping[str, Any]) -> Change | None:
        """A DeathWatch as listed or watched. None when its version is the one already
        compiled (its own status write coming back)."""
        meta = body.get("metadata") or {}
        key: Key = (meta.get("namespace") or "default", meta.get("name") or "")
        generation = meta.get("generation")
        version: Version = (
            str(meta.get("uid") or ""),
            generation if isinstance(generation, int) else None,
        )
        if key not in self.conditions:
            try:
                published = (body.get("status") or {}).get("conditions") or []
                self.conditions[key] = msgspec.convert(published, list[Condition])
            except (msgspec.ValidationError, AttributeError):
                self.conditions[key] = []
        if self._versions.get(key) == version:
            return None
        before = self._watches.get(key)
        self._versions[key] = version
        try:
            watch = read_deathwatch(body, self.registry)
        except SpecError as exc:
            log.error("deathwatch invalid", namespace=key[0], deathwatch=key[1], error=str(exc))
            self.invalid[key] = str(exc)
            self._set(key, None)
            return Change(key, None, select=False)
        self.invalid.pop(key, None)
        self._set(key, watch)
        select = (
            before is None
            or before.selector != watch.selector
            or before.sandboxes != watch.sandboxes
            or before.uid != watch.uid
        )
        return Change(key, watch, select)

    def remove(self, key: Key) -> bool:
        known = key in self._versions
        self._versions.pop(key, None)
        self.invalid.pop(key, None)
        self.conditions.pop(key, None)
        self._set(key, None)
        return known

    def _set(self, key: Key, watch: Watch | None) -> None:
        if watch is None:
            self._watches.pop(key, None)
        else:
            self._watches[key] = watch
        members = [w for w in self._watches.values() if w.namespace == key[0]]
        if members:
            self._by_namespace[key[0]] = sorted(members, key=Watch.sort_key)
        else:
            self._by_namespace.pop(key[0], None)
