"""The list/watch protocol (deathwatch._kube.listwatch), written once for the controller's
reflectors, its adoption of a DeathWatch's pods, the public client and the firewall agent's
watches: driven here over a scripted transport, every rule of it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

from deathwatch._kube.errors import ApiError, NoAnswer, describe, label, retryable
from deathwatch._kube.listwatch import (
    Item,
    Listed,
    Listing,
    ListWatch,
    Noted,
    Output,
    outputs,
)


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def listing(*items: dict[str, Any], version: str, more: str | None = None) -> bytes:
    meta: dict[str, Any] = {"resourceVersion": version}
    if more:
        meta["continue"] = more
    return json.dumps({"metadata": meta, "items": list(items)}).encode()


def event(kind: str, o: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": o}).encode()


class Script:
    """A transport that answers from a script: each GET and each watch takes the next
    answer (bytes, a list of lines, or an exception), and records what was asked."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, dict[str, Any]]] = []
        self.slept: list[float] = []

    def _next(self) -> Any:
        if not self.answers:
            raise asyncio.CancelledError  # the script is over: end the run as a cancel would
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def get(self, params: Mapping[str, str | int]) -> bytes:
        self.asked.append(("GET", dict(params)))
        answer = self._next()
        assert isinstance(answer, bytes)
        return answer

    @asynccontextmanager
    async def stream(self, params: Mapping[str, str | int]) -> AsyncIterator[AsyncIterator[bytes]]:
        self.asked.append(("WATCH", dict(params)))
        lines = self._next()

        async def each() -> AsyncIterator[bytes]:
            for line in lines:
                if isinstance(line, BaseException):
                    raise line
                yield line

        yield each()

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def run(lw: ListWatch, transport: Script, limit: int = 100) -> list[Output]:
    got: list[Output] = []
    try:
        async for out in outputs(lw, transport):
            got.append(out)
            if len(got) >= limit:
                break
    except asyncio.CancelledError:
        pass
    return got


def names(got: list[Output]) -> list[tuple[str, str]]:
    return [
        (o.type, json.loads(bytes(o.raw))["metadata"]["name"]) for o in got if isinstance(o, Item)
    ]


async def test_pages_then_a_watch_resumed_from_the_last_version_delivered() -> None:
    t = Script(
        listing(obj("a", "5"), version="9", more="t1"),
        listing(obj("b", "7"), version="10"),
        [event("ADDED", obj("c", "11")), event("BOOKMARK", obj("", "15"))],  # the server ends it
        [event("DELETED", obj("a", "16"))],
    )
    lw = ListWatch(label_selector="app=sandbox", page_size=1)
    got = await run(lw, t)
    assert isinstance(got[0], Listing)
    assert names(got) == [("LISTED", "a"), ("LISTED", "b"), ("ADDED", "c"), ("DELETED", "a")]
    assert [o for o in got if isinstance(o, Listed)] == [Listed("10", 2)]
    asked = [(verb, p.get("continue"), p.get("resourceVersion")) for verb, p in t.asked]
    assert asked == [("GET", None, None), ("GET", "t1", None), ("WATCH", None, "10"),
                     ("WATCH", None, "15"), ("WATCH", None, "16")]  # fmt: skip
    assert all(p["labelSelector"] == "app=sandbox" for _, p in t.asked)
    assert lw.version == "16" and lw.listings == 1


async def test_410_in_a_watch_lists_again_at_once() -> None:
    gone = {
        "kind": "Status",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version",
    }
    t = Script(
        listing(version="3"), [event("ERROR", gone)], listing(obj("a", "9"), version="9"), []
    )
    got = await run(ListWatch(), t)
    noted = [o for o in got if isinstance(o, Noted)]
    assert [n.what for n in noted] == ["expired"]
    assert sum(isinstance(o, Listing) for o in got) == 2
    assert t.slept == []  # a relist is no failure: no backoff


async def test_a_continue_token_that_expired_lists_again_from_the_start() -> None:
    t = Script(listing(obj("a", "1"), version="5", more="t"), ApiError(410, "Expired"),
               listing(obj("a", "1"), obj("b", "2"), version="6"), [])  # fmt: skip
    got = await run(ListWatch(), t)
    assert names(got) == [("LISTED", "a"), ("LISTED", "a"), ("LISTED", "b")]
    assert [o for o in got if isinstance(o, Listed)] == [Listed("6", 2)]


async def test_failures_back_off_and_the_count_resets_after_a_good_watch() -> None:
    cut = NoAnswer("connection reset")
    t = Script(NoAnswer("refused"), ApiError(503, "Unavailable"), listing(version="4"), [cut],
               [event("ADDED", obj("a", "5"))], [cut], [])  # fmt: skip
    got = await run(ListWatch(backoff=(1.0, 2.0, 5.0)), t)
    assert t.slept == [1.0, 2.0, 5.0, 1.0]
    failed = [o for o in got if isinstance(o, Noted) and o.what == "failed"]
    assert [label(n.error) for n in failed if n.error] == [
        "connection",
        "503",
        "connection",
        "connection",
    ]
    # resumed where it was after each cut, never a new listing
    assert [p.get("resourceVersion") for verb, p in t.asked if verb == "WATCH"] == [
        "4",
        "4",
        "5",
        "5",
        "5",
    ]


async def test_a_bug_is_never_retried() -> None:
    t = Script(KeyError("status"))
    with pytest.raises(KeyError):
        await run(ListWatch(), t)
    assert t.slept == []


async def test_an_error_the_caller_calls_fatal_ends_the_run() -> None:
    t = Script(ApiError(403, "Forbidden"))
    with pytest.raises(ApiError) as raised:
        await run(ListWatch(fatal=lambda e: isinstance(e, ApiError) and e.forbidden), t)
    assert raised.value.forbidden and t.slept == []


async def test_an_optional_collection_not_served_is_absent_until_it_is() -> None:
    missing = ApiError(404, "NotFound")
    t = Script(missing, missing, listing(obj("s", "2"), version="2"), [])
    lw = ListWatch(optional=True, absent_retry=10.0)
    got = await run(lw, t)
    assert [o.what for o in got if isinstance(o, Noted)] == ["absent", "installed"]
    assert t.slept == [10.0, 10.0] and not lw.absent and lw.listings == 1


async def test_one_listing_with_limited_attempts() -> None:
    t = Script(NoAnswer("refused"), listing(obj("a", "1"), version="3", more="x"),
               listing(obj("b", "2"), version="3"))  # fmt: skip
    got = await run(ListWatch(follow=False, attempts=3), t)
    assert names(got) == [("LISTED", "a"), ("LISTED", "b")]
    assert not [verb for verb, _ in t.asked if verb == "WATCH"]
    t = Script(NoAnswer("refused"), NoAnswer("refused"))
    with pytest.raises(NoAnswer):
        await run(ListWatch(follow=False, attempts=2), t)


async def test_a_line_that_is_not_an_event_is_a_broken_stream_resumed() -> None:
    t = Script(listing(version="1"), [b"{not json"], [event("ADDED", obj("a", "2"))], [])
    got = await run(ListWatch(backoff=(0.5,)), t)
    assert names(got) == [("ADDED", "a")]
    assert t.slept == [0.5]


def test_api_errors_say_what_the_server_said() -> None:
    body = json.dumps({"kind": "Status", "code": 422, "message": "spec.x: Invalid value"}).encode()
    e = ApiError(422, "Unprocessable Entity", body)
    assert (e.status, e.message, describe(e), label(e)) == (
        422, "spec.x: Invalid value", "422: spec.x: Invalid value", "422")  # fmt: skip
    assert not retryable(e) and not e.conflict
    assert ApiError(409).conflict and ApiError(404).not_found and ApiError(410).gone
    assert ApiError(429).throttled and retryable(ApiError(429)) and retryable(ApiError(500))
    assert retryable(ApiError(403))  # a restarting API server, until its caches fill
    assert (
        retryable(NoAnswer("x", timeout=True)) and label(NoAnswer("x", timeout=True)) == "timeout"
    )
    assert not retryable(KeyError("x")) and label(KeyError("x")) == "KeyError"
