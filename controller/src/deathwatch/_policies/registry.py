"""Which policies exist, and which one judges a given pod.

Built-ins are always present. Third-party policies register under the entry-point group
`deathwatch.policies` (name = policy name, value = a Policy object or a no-argument factory).
Automatic selection (`auto`) tries only the built-ins, in their documented order: a plugin
is used only when configuration names it, so installing a package can never silently
change the verdicts of pods nobody asked it to judge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import cache
from importlib.metadata import entry_points

from deathwatch._engine.contract import ENTRY_POINT_GROUP, Policy, PolicySettings
from deathwatch._engine.podview import PodView
from deathwatch._policies.builtin import BUILTIN_ORDER
from deathwatch._policies.guard import Guarded

AUTO = "auto"


class UnknownPolicy(ValueError):
    def __init__(self, name: str, known: Iterable[str], detail: str | None = None) -> None:
        message = f"policy {name!r} is not known; known: {AUTO}, {', '.join(sorted(known))}"
        if detail:
            message = f"policy {name!r} could not be loaded: {detail}"
        super().__init__(message)
        self.name = name


class PolicyRegistry:
    def __init__(
        self,
        policies: Mapping[str, Policy],
        auto_order: Iterable[Policy] = BUILTIN_ORDER,
        broken: Mapping[str, str] | None = None,
    ) -> None:
        self._policies = dict(policies)
        self._auto = tuple(auto_order)
        self._broken = dict(broken or {})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._policies))

    def get(self, name: str) -> Policy:
        policy = self._policies.get(name)
        if policy is None:
            raise UnknownPolicy(name, self._policies, self._broken.get(name))
        return policy

    def validate(self, name: str) -> str:
        """Check a configured policy name (auto or known); return it."""
        if name != AUTO:
            self.get(name)
        return name

    def select(self, pod: PodView, configured: str, settings: PolicySettings) -> Policy:
        if configured != AUTO:
            return self.get(configured)
        for policy in self._auto:
            if policy.applies(pod, settings):
                return policy
        return self._auto[-1]


def _load_entry_points() -> tuple[dict[str, Policy], dict[str, str]]:
    loaded: dict[str, Policy] = {}
    broken: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = ep.load()
            policy = value() if isinstance(value, type) else value
        except Exception as exc:  # a broken plugin must not take the built-ins down
            broken[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
            continue
        if not isinstance(policy, Policy):
            broken[ep.name] = f"{ep.value} is not a Policy (needs name, applies, judge)"
            continue
        if policy.name != ep.name:
            broken[ep.name] = f"{ep.value} calls itself {policy.name!r}, registered as {ep.name!r}"
            continue
        loaded[ep.name] = Guarded(policy)  # third-party code: time-bounded (guard.py)
    return loaded, broken


@cache
def default_registry() -> PolicyRegistry:
    """Built-ins plus every installed plugin (loaded once per process)."""
    plugins, broken = _load_entry_points()
    policies: dict[str, Policy] = dict(plugins)
    for builtin in BUILTIN_ORDER:
        policies[builtin.name] = builtin  # built-in names cannot be hijacked by a plugin
    return PolicyRegistry(policies, BUILTIN_ORDER, broken)
