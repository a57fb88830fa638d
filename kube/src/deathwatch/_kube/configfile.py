"""A configuration file's errors, told as one line naming the field and the value: the
delivery sinks' file (controller) and the firewall agents' config share this spelling."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec


class ConfigError(ValueError):
    """A configuration that cannot be used: one line naming the field and the value."""


def explain(
    exc: msgspec.ValidationError,
    data: Any,
    expected: Mapping[str, str],
    known: Iterable[str] = (),
) -> str:
    """msgspec's error, as `sinks[0].timeoutSeconds: expected seconds, above 0 and at most 30,
    got 90`. `expected`: what each field takes, by its path with indexes as `[]`; `known`:
    the top-level keys, named when one is unknown."""
    text = str(exc)
    _, at, path = text.rpartition(" - at `$")
    where = path.rstrip("`").lstrip(".") if at else ""  # "" for the top level
    if unknown := re.search(r"unknown field `([^`]*)`", text):
        names = ", ".join(known)
        hint = f" (known: {names})" if names and not where else ""
        return f"{where + ': ' if where else ''}unknown field {unknown.group(1)!r}{hint}"
    if missing := re.search(r"missing required field `([^`]*)`", text):
        key = f"{where}.{missing.group(1)}" if where else missing.group(1)
        generic = re.sub(r"\[\d+\]", "[]", key)
        return f"{key}: expected {expected.get(generic, 'a value')}, got nothing"
    generic = re.sub(r"\[\d+\]", "[]", where)
    if generic not in expected:
        return text
    value: Any = data
    try:
        for part in re.findall(r"[^.\[\]]+", where):
            value = value[int(part)] if isinstance(value, list) else value.get(part)
    except (IndexError, KeyError, AttributeError, ValueError, TypeError):
        value = "?"  # a path msgspec names that the data does not hold as we walk it
    return f"{where}: expected {expected[generic]}, got {value!r}"
