"""One spelling of a configuration file's errors, shared by the delivery sinks' file and the
firewall agents' config: the field, what it takes, and the value given."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import pytest

from deathwatch._kube.configfile import explain


class Sink(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    name: str
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=30)] = 5.0


class File(msgspec.Struct, forbid_unknown_fields=True):
    sinks: list[Sink]


EXPECTED = {"sinks[].timeoutSeconds": "seconds, above 0 and at most 30", "sinks[].name": "a name"}


def told(data: Any, known: tuple[str, ...] = ()) -> str:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert(data, File)
    return explain(caught.value, data, EXPECTED, known)


def test_a_bad_value_is_named_with_what_the_field_takes() -> None:
    data = {"sinks": [{"name": "a"}, {"name": "b", "timeoutSeconds": 90}]}
    assert told(data) == "sinks[1].timeoutSeconds: expected seconds, above 0 and at most 30, got 90"


def test_an_unknown_field_is_named_where_it_is_and_at_the_top_with_the_known_ones() -> None:
    assert told({"sinks": [{"name": "a", "url": "x"}]}) == "sinks[0]: unknown field 'url'"
    assert told({"sinks": [], "extra": 1}, ("sinks",)) == "unknown field 'extra' (known: sinks)"


def test_a_missing_field_says_what_it_takes() -> None:
    assert told({"sinks": [{}]}) == "sinks[0].name: expected a name, got nothing"


def test_a_path_the_data_does_not_hold_says_so_and_never_raises() -> None:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.convert({"sinks": [{"name": "a", "timeoutSeconds": 90}]}, File)
    told_of_other = explain(caught.value, {"sinks": []}, EXPECTED)  # the data given was not it
    assert (
        told_of_other
        == "sinks[0].timeoutSeconds: expected seconds, above 0 and at most 30, got '?'"
    )
