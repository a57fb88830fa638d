"""Which pods a DeathWatch selects: the one definition of a sandbox (ADR 0037).

The controller judges the pods its DeathWatches select, and the firewall agent guards the
same pods on its node: both ask `selects`, on a selection compiled by `compile_selector`
(the controller from its validated spec, the agent from the DeathWatch as it reads it,
`read_selection`). A pod is selected when it is in the DeathWatch's namespace and its labels
match `spec.podSelector`; with `spec.sandboxes: agent-sandbox`, only a pod agent-sandbox
made for a Sandbox (its controller ownerReference is a Sandbox, and it carries the label
agent-sandbox puts on every pod of one). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from deathwatch._kube.selector import (
    Operator,
    Requirement,
    Selector,
    SelectorError,
    check_key,
    check_value,
)

SANDBOX_GROUP = "agents.x-k8s.io"
# the label agent-sandbox's controller puts on every pod it makes for a Sandbox
TRACKING_LABEL = "agents.x-k8s.io/sandbox-name-hash"
AGENT_SANDBOX = "agent-sandbox"  # DeathWatch spec.sandboxes
# names the release whose controller serves a DeathWatch (none: the one without an id)
CONTROLLER_ID_ANNOTATION = "deathwatch.dev/controller-id"
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def compile_selector(
    match_labels: Mapping[str, str] | None,
    match_expressions: Sequence[tuple[str, str, Sequence[str]]],
    where: str,
) -> Selector:
    """A metav1.LabelSelector (matchLabels, then matchExpressions as (key, operator, values))
    as a matcher; every error names its field under `where`. Nothing given selects every pod."""
    requirements: list[Requirement] = []
    for key, value in sorted((match_labels or {}).items()):
        w = f"{where}.matchLabels.{key}"
        requirements.append(
            Requirement(check_key(key, w), "In", frozenset({check_value(value, w)}))
        )
    for i, (key, operator, values) in enumerate(match_expressions):
        w = f"{where}.matchExpressions[{i}]"
        if operator not in _OPERATORS:
            raise SelectorError(f"{w}.operator: expected one of {', '.join(_OPERATORS)}, "
                                f"got {operator!r:.40}")  # fmt: skip
        if operator in ("In", "NotIn") and not values:
            raise SelectorError(f"{w}.values: operator {operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and values:
            raise SelectorError(
                f"{w}.values: operator {operator} takes no values, got {list(values)!r}"
            )
        requirements.append(
            Requirement(check_key(key, w), cast(Operator, operator), frozenset(values))
        )
    return Selector(tuple(requirements))


def selects(selector: Selector, sandboxes: str | None, labels: Mapping[str, str],
            sandbox: str | None) -> bool:  # fmt: skip
    """Whether a DeathWatch's selection takes a pod of its namespace: `sandbox` is the
    Sandbox controlling the pod (`controlling_sandbox`), if any."""
    if sandboxes is not None and (sandbox is None or TRACKING_LABEL not in labels):
        return False  # agent-sandbox's own pods only: its ownerReference and its label
    return selector.matches(labels)


def controlling_sandbox(owner_references: Iterable[Mapping[str, Any]]) -> str | None:
    """The name of the agent-sandbox Sandbox controlling a pod, from its ownerReferences as
    JSON (any version of the group: the name is what links them)."""
    for ref in owner_references:
        if (
            ref.get("controller") is True
            and ref.get("kind") == "Sandbox"
            and str(ref.get("apiVersion") or "").split("/")[0] == SANDBOX_GROUP
            and ref.get("name")
        ):
            return str(ref["name"])
    return None


@dataclass(frozen=True, slots=True)
class Selection:
    """What one DeathWatch selects, as the firewall agent reads it."""

    namespace: str
    selector: Selector
    sandboxes: str | None
    controller: str = ""  # the controller id that serves it ("": the one without an id)

    def selects(self, pod: Mapping[str, Any]) -> bool:
        """Whether this DeathWatch selects `pod` (a Pod as JSON)."""
        meta = pod.get("metadata") or {}
        if (meta.get("namespace") or "default") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        sandbox = controlling_sandbox(meta.get("ownerReferences") or ())
        return selects(self.selector, self.sandboxes, labels, sandbox)


def read_selection(deathwatch: Mapping[str, Any]) -> Selection:
    """A DeathWatch's selection (`spec.podSelector`, `spec.sandboxes`, its namespace), read
    from its JSON. Raises SelectorError naming the field that cannot be read: the controller
    calls such a DeathWatch invalid and judges nothing by it, so nothing is guarded by it."""
    meta = deathwatch.get("metadata") or {}
    spec = deathwatch.get("spec") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        raise SelectorError("spec: expected an object")
    sandboxes = spec.get("sandboxes")
    if sandboxes not in (None, AGENT_SANDBOX):
        raise SelectorError(f"spec.sandboxes: expected {AGENT_SANDBOX!r}, got {sandboxes!r:.40}")
    chosen = spec.get("podSelector")
    if chosen is None:
        chosen = {}
    if not isinstance(chosen, Mapping):
        raise SelectorError("spec.podSelector: expected an object")
    labels = chosen.get("matchLabels") or {}
    expressions = chosen.get("matchExpressions") or []
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise SelectorError("spec.podSelector.matchLabels: expected a map of strings")
    if not isinstance(expressions, list):
        raise SelectorError("spec.podSelector.matchExpressions: expected a list")
    terms: list[tuple[str, str, Sequence[str]]] = []
    for i, e in enumerate(expressions):
        values = e.get("values") or [] if isinstance(e, Mapping) else None
        if (
            not isinstance(e, Mapping)
            or not isinstance(e.get("key"), str)
            or not isinstance(values, list)
            or not all(isinstance(v, str) for v in values)
        ):
            raise SelectorError(f"spec.podSelector.matchExpressions[{i}]: expected "
                                "{key, operator, values}")  # fmt: skip
        terms.append((e["key"], str(e.get("operator")), values))
    selector = compile_selector(labels, terms, "spec.podSelector")
    notes = meta.get("annotations") or {}
    controller = notes.get(CONTROLLER_ID_ANNOTATION) if isinstance(notes, Mapping) else None
    return Selection(str(meta.get("namespace") or "default"), selector, sandboxes,
                     str(controller or ""))  # fmt: skip
