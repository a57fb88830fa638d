"""The typed resources (resources.py) and the CRD schemas (manifests/base/crds) are one
schema: every field on both sides, with the same type, enum, bound and default. A field
added to one and not the other fails here, before it can fail on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
import yaml

from deathwatch._api.resources import (
    DeathWatchSpec,
    DeathWatchStatus,
    SandboxVerdictSpec,
    SandboxVerdictStatus,
)

CRDS = Path(__file__).resolve().parents[2] / "manifests" / "base" / "crds"


def schema(crd: str, part: str) -> dict[str, Any]:
    doc = yaml.safe_load((CRDS / f"{crd}.deathwatch.dev.yaml").read_text())
    (version,) = doc["spec"]["versions"]
    part_schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"][part]
    return part_schema


def _no_none(t: mi.Type) -> mi.Type:
    if isinstance(t, mi.UnionType):
        (only,) = [x for x in t.types if not isinstance(x, mi.NoneType)]
        return only
    return t


def disagreements(t: mi.Type, s: dict[str, Any], path: str) -> list[str]:
    """Where the struct type `t` and the OpenAPI schema `s` differ, one line each."""
    t = _no_none(t)
    out: list[str] = []

    def same(what: str, ours: object, theirs: object) -> None:
        if ours != theirs:
            out.append(f"{path}: {what}: struct {ours!r}, CRD {theirs!r}")

    def bound(ours: object, key: str) -> None:
        same(key, ours, s.get(key))

    if isinstance(t, mi.StructType):
        same("type", "object", s.get("type"))
        fields = {f.encode_name: f for f in t.fields}
        props = s.get("properties", {})
        same("fields", sorted(fields), sorted(props))
        required = {f.encode_name for f in t.fields if f.required}
        if not set(s.get("required", [])) <= required:
            out.append(f"{path}: CRD requires {s['required']}, struct requires {sorted(required)}")
        for name in fields.keys() & props.keys():
            f, p = fields[name], props[name]
            if "default" in p:
                same(f"{name} default", f.default, p["default"])
            out += disagreements(f.type, p, f"{path}.{name}")
    elif isinstance(t, mi.LiteralType):
        same("type", "string", s.get("type"))
        same("enum", sorted(t.values), sorted(s.get("enum", [])))  # type: ignore[type-var]
    elif isinstance(t, mi.EnumType):
        same("type", "string", s.get("type"))
        same("enum", sorted(m.value for m in t.cls), sorted(s.get("enum", [])))
    elif isinstance(t, mi.StrType):
        same("type", "string", s.get("type"))
        bound(t.max_length, "maxLength")
        bound(t.min_length, "minLength")
        bound(t.pattern, "pattern")
    elif isinstance(t, mi.DateTimeType):
        same("type", ("string", "date-time"), (s.get("type"), s.get("format")))
    elif isinstance(t, mi.BoolType):
        same("type", "boolean", s.get("type"))
    elif isinstance(t, mi.IntType):
        same("type", "integer", s.get("type"))
        bound(t.ge, "minimum")
        bound(t.le, "maximum")
    elif isinstance(t, mi.FloatType):
        same("type", "number", s.get("type"))
        same("minimum", t.gt if t.gt is not None else t.ge, s.get("minimum"))
        same("exclusiveMinimum", True if t.gt is not None else None, s.get("exclusiveMinimum"))
        bound(t.le, "maximum")
    elif isinstance(t, mi.ListType):
        same("type", "array", s.get("type"))
        bound(t.max_length, "maxItems")
        out += disagreements(t.item_type, s.get("items", {}), f"{path}[]")
    elif isinstance(t, mi.DictType):
        same("type", "object", s.get("type"))
        bound(t.max_length, "maxProperties")
        out += disagreements(t.value_type, s.get("additionalProperties", {}), f"{path}{{}}")
    else:
        out.append(f"{path}: no rule to compare {type(t).__name__}")
    return out


@pytest.mark.parametrize(
    ("crd", "part", "struct"),
    [
        ("deathwatches", "spec", DeathWatchSpec),
        ("deathwatches", "status", DeathWatchStatus),
        ("sandboxverdicts", "spec", SandboxVerdictSpec),
        ("sandboxverdicts", "status", SandboxVerdictStatus),
    ],
)
def test_struct_and_crd_schema_agree(crd: str, part: str, struct: type[msgspec.Struct]) -> None:
    assert disagreements(mi.type_info(struct), schema(crd, part), f"{crd}.{part}") == []


def test_the_comparison_catches_a_difference() -> None:
    """The check itself must be able to fail: a schema with one field changed disagrees."""
    s = schema("sandboxverdicts", "status")
    s["properties"]["state"]["enum"] = ["Alive", "Dead"]
    s["properties"]["extra"] = {"type": "string"}
    found = disagreements(mi.type_info(SandboxVerdictStatus), s, "sv")
    assert any("state: enum" in line for line in found)
    assert any("fields" in line for line in found)
