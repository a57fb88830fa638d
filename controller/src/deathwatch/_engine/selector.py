"""Label selectors: the kubectl string form (`--selector`) and the API object form
(`podSelector` of a DeathWatch), compiled to one matcher with the API's semantics."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# A qualified label key: optional DNS-subdomain prefix, then a name of at most 63 characters.
_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class SelectorError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        # NotIn also matches a pod without the key, as in Kubernetes
        return labels.get(self.key) not in self.values


@dataclass(frozen=True, slots=True)
class Selector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def everything(self) -> bool:
        return not self.requirements


def _check_key(key: str, where: str) -> str:
    if not _KEY.match(key):
        raise SelectorError(f"{where}: invalid label key {key!r}")
    return key


def _check_value(value: str, where: str) -> str:
    if not _VALUE.match(value):
        raise SelectorError(f"{where}: invalid label value {value!r}")
    return value


def parse_selector(text: str) -> Selector:
    """kubectl's equality-based form: `k=v`, `k==v`, `k!=v`, `k` (exists), `!k` (absent),
    comma-separated. Set-based `k in (a,b)` is rejected with a clear message."""
    requirements: list[Requirement] = []
    for raw in text.split(","):
        term = raw.strip()
        where = f"--selector term {term!r}"
        if not term:
            raise SelectorError(f"--selector {text!r}: empty term")
        if " in " in term or " notin " in term or "(" in term:
            raise SelectorError(f"{where}: set-based terms are not supported; use k=v, k!=v, k, !k")
        if "!=" in term:
            key, value = term.split("!=", 1)
            requirements.append(
                Requirement(
                    _check_key(key.strip(), where),
                    "NotIn",
                    frozenset({_check_value(value.strip(), where)}),
                )
            )
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            requirements.append(
                Requirement(
                    _check_key(key.strip(), where),
                    "In",
                    frozenset({_check_value(value.strip(), where)}),
                )
            )
        elif term.startswith("!"):
            requirements.append(Requirement(_check_key(term[1:].strip(), where), "DoesNotExist"))
        else:
            requirements.append(Requirement(_check_key(term, where), "Exists"))
    return Selector(tuple(requirements))


def selector_from_object(obj: Mapping[str, Any] | None, where: str = "podSelector") -> Selector:
    """A metav1.LabelSelector (matchLabels + matchExpressions). Empty or None: everything."""
    if obj is None:
        return Selector()
    if not isinstance(obj, Mapping):
        raise SelectorError(f"{where}: expected an object, got {obj!r}")
    requirements: list[Requirement] = []
    match_labels = obj.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise SelectorError(f"{where}.matchLabels: expected an object, got {match_labels!r}")
    for key, value in sorted(match_labels.items()):
        w = f"{where}.matchLabels.{key}"
        if not isinstance(value, str):
            raise SelectorError(f"{w}: expected a string, got {value!r}")
        requirements.append(
            Requirement(_check_key(key, w), "In", frozenset({_check_value(value, w)}))
        )
    expressions = obj.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise SelectorError(f"{where}.matchExpressions: expected a list, got {expressions!r}")
    for i, expr in enumerate(expressions):
        w = f"{where}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise SelectorError(f"{w}: expected an object, got {expr!r}")
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str):
            raise SelectorError(f"{w}.key: expected a string, got {key!r}")
        if op not in _OPERATORS:
            raise SelectorError(
                f"{w}.operator: expected one of {', '.join(_OPERATORS)}, got {op!r}"
            )
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"{w}.values: expected a list of strings, got {values!r}")
        if op in ("In", "NotIn") and not values:
            raise SelectorError(f"{w}.values: operator {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise SelectorError(f"{w}.values: operator {op} takes no values, got {values!r}")
        requirements.append(Requirement(_check_key(key, w), op, frozenset(values)))
    return Selector(tuple(requirements))
