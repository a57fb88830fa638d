"""A DeathWatch's spec read into plain data, with errors that name the field and value."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from deathwatch._engine.selector import Selector, SelectorError, selector_from_object
from deathwatch._engine.timeutil import UTC, parse_time
from deathwatch._policies import AUTO, PolicyRegistry, PolicySettings, UnknownPolicy

GROUP = "deathwatch.dev"
VERSION = "v1alpha1"
DEFAULT_RETENTION = timedelta(hours=1)

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


class SpecError(ValueError):
    """A DeathWatch field the controller cannot use; the message names field and value."""


def parse_duration(text: str, field: str = "duration") -> timedelta:
    """A Go duration ("1h", "90m", "1h30m", "45s"), as the CRD schema's pattern allows."""
    if not isinstance(text, str) or not text:
        raise SpecError(f"{field}: expected a duration like 1h or 30m, got {text!r}")
    pos, seconds = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise SpecError(f"{field}: expected a duration like 1h or 30m, got {text!r}")
    return timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class DeathWatchSpec:
    namespace: str
    name: str
    uid: str
    created: datetime | None
    selector: Selector
    policy: str
    settings: PolicySettings
    retention: timedelta
    body: Mapping[str, Any]  # the object, for owner references

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def sort_key(self) -> tuple[datetime, str]:
        # The oldest DeathWatch wins a pod several of them select: deterministic and stable.
        return (self.created or datetime.max.replace(tzinfo=UTC), self.name)


def read_deathwatch(body: Mapping[str, Any], registry: PolicyRegistry) -> DeathWatchSpec:
    """Raises SpecError naming the first field that cannot be used."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec: expected an object, got {spec!r}")
    try:
        selector = selector_from_object(spec.get("podSelector"), "spec.podSelector")
    except SelectorError as exc:
        raise SpecError(str(exc)) from None
    policy = spec.get("policy") or AUTO
    try:
        registry.validate(policy)
    except UnknownPolicy as exc:
        raise SpecError(f"spec.policy: {exc}") from None
    multiplier = (spec.get("execProbe") or {}).get("windowMultiplier", 2.0)
    if (
        isinstance(multiplier, bool)
        or not isinstance(multiplier, int | float)
        or not multiplier > 0
    ):
        raise SpecError(
            f"spec.execProbe.windowMultiplier: expected a positive number, got {multiplier!r}"
        )
    ports = spec.get("agentPorts") or []
    if not isinstance(ports, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports
    ):
        raise SpecError(f"spec.agentPorts: expected TCP port numbers, got {ports!r}")
    retention_text = spec.get("verdictRetention")
    retention = (
        DEFAULT_RETENTION
        if retention_text is None
        else parse_duration(retention_text, "spec.verdictRetention")
    )
    return DeathWatchSpec(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        created=parse_time(meta.get("creationTimestamp")),
        selector=selector,
        policy=policy,
        settings=PolicySettings(
            exec_window_multiplier=float(multiplier), agent_ports=frozenset(ports)
        ),
        retention=retention,
        body=body,
    )
