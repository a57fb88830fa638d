"""A DeathWatch's rules: its spec read into what judging needs, with errors that name the field
and value.

The spec is decoded through its typed model (resources.DeathWatchSpec: types, enums and
bounds as the CRD declares them); what a schema cannot say (label syntax, a policy that is
installed, a duration's value) is checked here. Any problem is a SpecError naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from deathwatch._api.resources import API_VERSION, DeathWatchSpec, LabelSelector
from deathwatch._engine.podview import PodView
from deathwatch._engine.raw import validation_field
from deathwatch._engine.timeutil import UTC, parse_time
from deathwatch._kube.selection import compile_selector, selects
from deathwatch._kube.selector import Selector, SelectorError
from deathwatch._policies import PolicyRegistry, PolicySettings, UnknownPolicy

DEFAULT_RETENTION = timedelta(hours=1)
MAX_RETENTION = timedelta(days=365)  # the CRD's bound (CEL) too: 8760h

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


def parse_duration(
    text: str, field: str = "duration", maximum: timedelta = MAX_RETENTION
) -> timedelta:
    """A Go duration ("1h", "90m", "1h30m", "45s"), as the CRD schema's pattern allows, at most
    `maximum` (a bound, so that no later date arithmetic can overflow)."""
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
    if not seconds <= maximum.total_seconds():  # also catches inf and nan
        raise SpecError(
            f"{field}: at most {maximum.total_seconds() / 3600:.0f}h, got {text[:40]!r}"
        )
    return timedelta(seconds=seconds)


@dataclass(frozen=True, slots=True)
class Rules:
    """A DeathWatch compiled for judging: which pods, which policy and settings, how long
    verdicts are kept. Compiled once per (uid, generation) (deathwatches.py); two
    compilations of one generation are equal, and are compared by `generation_key`, never by
    identity."""

    namespace: str
    name: str
    uid: str
    generation: int | None
    created: datetime | None
    selector: Selector
    sandboxes: str | None  # "agent-sandbox": only the pods of agent-sandbox Sandboxes
    policy: str
    settings: PolicySettings
    retention: timedelta

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def revision(self) -> tuple[str, int | None]:
        """(uid, generation): which DeathWatch, and which edit of it."""
        return (self.uid, self.generation)

    def selects(self, pod: PodView) -> bool:
        # the firewall agent asks the same of the pods on its node (ADR 0037)
        return selects(self.selector, self.sandboxes, pod.labels, pod.sandbox)

    def owner_reference(self) -> dict[str, Any]:
        """What each of its SandboxVerdicts names as owner: they go with it."""
        return {
            "apiVersion": API_VERSION,
            "kind": "DeathWatch",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def sort_key(self) -> tuple[datetime, str]:
        # The oldest DeathWatch wins a pod several of them select: deterministic and stable.
        return (self.created or datetime.max.replace(tzinfo=UTC), self.name)


def _selector(selector: LabelSelector | None, where: str) -> Selector:
    """A metav1.LabelSelector (matchLabels + matchExpressions). None selects everything."""
    if selector is None:
        return Selector()
    terms = [(e.key, e.operator, e.values or []) for e in selector.match_expressions or ()]
    return compile_selector(selector.match_labels, terms, where)


def read_deathwatch(body: Mapping[str, Any], registry: PolicyRegistry) -> Rules:
    """Raises SpecError naming the first field that cannot be used, and nothing else. An
    unforeseen failure is a SpecError too ("cannot be read"), so one bad DeathWatch costs one
    status and never takes a handler down; tests/unit/test_rules.py fails if any object reaches
    that net (every error must name its field)."""
    try:
        return _read(body, registry)
    except SpecError:
        raise
    except Exception as exc:
        raise SpecError(f"spec: cannot be read: {type(exc).__name__}: {exc}"[:300]) from exc


def _metadata(body: object) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise SpecError(f"object: expected a DeathWatch object, got {type(body).__name__}")
    meta = body.get("metadata") or {}
    if not isinstance(meta, Mapping):
        raise SpecError(f"metadata: expected an object, got {type(meta).__name__}")
    for name in ("name", "namespace", "uid", "creationTimestamp"):
        value = meta.get(name)
        if value is not None and not isinstance(value, str):
            raise SpecError(f"metadata.{name}: expected a string, got {type(value).__name__}")
    generation = meta.get("generation")
    if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
        raise SpecError(f"metadata.generation: expected an integer, got {generation!r:.40}")
    return meta


def _read(body: Mapping[str, Any], registry: PolicyRegistry) -> Rules:
    meta = _metadata(body)
    try:
        spec = msgspec.convert(body.get("spec") or {}, DeathWatchSpec)
    except msgspec.ValidationError as exc:
        field, problem = validation_field(exc)
        raise SpecError(f"spec.{field}: {problem}") from None
    try:
        selector = _selector(spec.pod_selector, "spec.podSelector")
    except SelectorError as exc:
        raise SpecError(str(exc)) from None
    try:
        registry.validate(spec.policy)
    except UnknownPolicy as exc:
        raise SpecError(f"spec.policy: {exc}") from None
    multiplier = spec.exec_probe.window_multiplier if spec.exec_probe else 2.0
    roles = spec.containers
    if roles is not None and (both := set(roles.sandbox) & set(roles.vital_sidecars)):
        raise SpecError(
            f"spec.containers: {sorted(both)[0]!r} is named both a sandbox container and a "
            "vital sidecar; a container is one or the other"
        )
    return Rules(
        namespace=meta.get("namespace") or "default",
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        generation=meta.get("generation"),
        created=parse_time(meta.get("creationTimestamp")),
        selector=selector,
        sandboxes=spec.sandboxes,
        policy=spec.policy,
        settings=PolicySettings(
            exec_window_multiplier=multiplier,
            agent_ports=frozenset(spec.agent_ports),
            sandbox_containers=frozenset(roles.sandbox) if roles else frozenset(),
            vital_sidecars=frozenset(roles.vital_sidecars) if roles else frozenset(),
        ),
        retention=parse_duration(spec.verdict_retention, "spec.verdictRetention"),
    )
