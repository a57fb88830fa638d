"""A DeathWatch the controller cannot use is a SpecError naming the field, and nothing else
may come out of the reader, whatever the object holds (the API enforces the CRD schema, but
the controller does not rely on it: an older CRD, or a bug, must cost one status, not a loop)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deathwatch._api.rules import MAX_RETENTION, Rules, SpecError, read_deathwatch
from deathwatch._policies import default_registry
from tests.examples import examples


def body(spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "ns", "uid": "u"}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"verdictRetention": "100000000h"}, "spec.verdictRetention: at most 8760h"),
        ({"verdictRetention": "9" * 31 + "h"}, "spec.verdictRetention: at most 8760h"),
        ({"verdictRetention": "1" + "0" * 400 + "h"}, "spec.verdictRetention: Expected str"),
        ({"verdictRetention": "forever"}, "spec.verdictRetention"),
        ({"verdictRetention": "x" * 33}, "spec.verdictRetention: Expected str of length <= 32"),
        ({"execProbe": {"windowMultiplier": 1e308}}, "spec.execProbe.windowMultiplier"),
        ({"execProbe": {"windowMultiplier": 0}}, "spec.execProbe.windowMultiplier"),
        ({"agentPorts": [70000]}, "spec.agentPorts[0]"),
        ({"agentPorts": list(range(1, 100))}, "spec.agentPorts: Expected array of length <= 64"),
        ({"podSelector": {"matchLabels": {"a b": "x"}}}, "spec.podSelector.matchLabels.a b"),
        ({"podSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}, "values"),
        ({"policy": "no-such"}, "spec.policy"),
        ("a string", "spec"),
        ({"containers": {"sandbox": ["Agent"]}}, "spec.containers.sandbox[0]"),
        ({"containers": {"vitalSidecars": "proxy"}}, "spec.containers.vitalSidecars"),
        ({"containers": {"sandbox": ["a"], "vitalSidecars": ["a"]}}, "spec.containers: 'a'"),
    ],
)
def test_an_unusable_field_is_named(spec: Any, field: str) -> None:
    with pytest.raises(SpecError) as info:
        read_deathwatch(body(spec), default_registry())
    assert field in str(info.value)


def test_the_sandbox_s_containers_are_read_into_its_settings() -> None:
    spec = {"containers": {"sandbox": ["agent"], "vitalSidecars": ["proxy"]}}
    settings = read_deathwatch(body(spec), default_registry()).settings
    assert settings.sandbox_containers == frozenset({"agent"})
    assert settings.vital_sidecars == frozenset({"proxy"})


def test_the_largest_retention_is_accepted() -> None:
    watch = read_deathwatch(body({"verdictRetention": "8760h"}), default_registry())
    assert watch.retention == MAX_RETENTION == timedelta(hours=8760)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip
durations = st.from_regex(r"\A([0-9]{1,400}(\.[0-9]{1,5})?(ns|us|µs|ms|s|m|h)){1,3}\Z")
specs = st.fixed_dictionaries(
    {},
    optional={
        "podSelector": st.one_of(
            json_values,
            st.fixed_dictionaries({}, optional={
                "matchLabels": st.dictionaries(st.text(max_size=70), st.text(max_size=70) | json_values, max_size=3),
                "matchExpressions": st.lists(st.fixed_dictionaries({}, optional={
                    "key": st.text(max_size=20) | json_values,
                    "operator": st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Bogus"]),
                    "values": st.lists(st.text(max_size=5), max_size=3) | json_values,
                }), max_size=3),
            }),
        ),
        "policy": st.sampled_from(["auto", "no-probe", "exec-probe", "Nope", ""]) | json_values,
        "execProbe": st.fixed_dictionaries({}, optional={"windowMultiplier": json_values}) | json_values,
        "agentPorts": st.lists(st.integers(-5, 70000), max_size=5) | json_values,
        "verdictRetention": durations | json_values,
        "containers": st.fixed_dictionaries({}, optional={
            "sandbox": st.lists(st.sampled_from(["agent", "tools", "Bad", ""]), max_size=3),
            "vitalSidecars": st.lists(st.sampled_from(["proxy", "agent"]), max_size=2),
        }) | json_values,
    },
)  # fmt: skip


@examples(1500, slow=True)
@given(st.one_of(specs, json_values))
def test_nothing_but_a_spec_error_comes_out_of_the_reader(spec: Any) -> None:
    try:
        watch = read_deathwatch(body(spec), default_registry())
    except SpecError as exc:
        message = str(exc)
    else:
        message = ""
    if message:
        assert message.startswith("spec"), message
        return
    assert isinstance(watch, Rules)
    assert timedelta(0) <= watch.retention <= MAX_RETENTION
    assert 0 < watch.settings.exec_window_multiplier <= 100


objects = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={
        "metadata": json_values | st.fixed_dictionaries({}, optional={
            "name": json_values, "namespace": json_values, "uid": json_values,
            "generation": json_values, "creationTimestamp": json_values,
        }),
        "spec": specs | json_values,
    }),
)  # fmt: skip


@examples(600, slow=True)
@given(objects)
def test_whatever_the_whole_object_an_error_names_its_field(obj: Any) -> None:
    """A Rules, or a SpecError that names the field at fault: never the catch-all."""
    try:
        watch = read_deathwatch(obj, default_registry())
    except SpecError as exc:
        message = str(exc)
        assert "cannot be read" not in message, message
        assert message.split(":", 1)[0].split(".", 1)[0].split("[", 1)[0] in (
            "object", "metadata", "spec",
        ), message  # fmt: skip
    else:
        assert isinstance(watch, Rules)
