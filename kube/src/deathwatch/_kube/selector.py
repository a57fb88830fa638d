"""Label selectors with the API's semantics: the kubectl string form (`--selector`) parsed
here, and the API object form (a DeathWatch's `podSelector`) compiled by the operator's
spec reader; both end as the same matcher. Pure; shared by the controller (DeathWatches,
replay) and the firewall agent (its node's labels against `enforceNodeSelector`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
# A label's name, and a label value that is not empty: at most 63 characters, alphanumeric
# at both ends (the one spelling of it: label values, controller ids, Sandbox names as labels)
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_VALUE = re.compile(_NAME)  # fullmatch it
# A qualified label key: optional DNS-subdomain prefix, then a name.
_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + _NAME + "$"
)
_VALUE = re.compile(f"^({_NAME})?$")  # a value in a selector may be empty


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


def check_key(key: str, where: str) -> str:
    if not _KEY.match(key):
        raise SelectorError(f"{where}: invalid label key {key!r}")
    return key


def check_value(value: str, where: str) -> str:
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
                    check_key(key.strip(), where),
                    "NotIn",
                    frozenset({check_value(value.strip(), where)}),
                )
            )
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            requirements.append(
                Requirement(
                    check_key(key.strip(), where),
                    "In",
                    frozenset({check_value(value.strip(), where)}),
                )
            )
        elif term.startswith("!"):
            requirements.append(Requirement(check_key(term[1:].strip(), where), "DoesNotExist"))
        else:
            requirements.append(Requirement(check_key(term, where), "Exists"))
    return Selector(tuple(requirements))
