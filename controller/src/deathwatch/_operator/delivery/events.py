"""A verdict's transition as a signed CloudEvent over HTTP, and what a receiver's answer
means. Pure: no I/O, the clock passed in (sender.py sends what these build).

The event (CloudEvents 1.0, HTTP binding):
- `id`: stable per (verdict, transition): `POD_UID/dead` and `POD_UID/gone` for the two
  final states (each happens once to a pod, whoever judges it), `POD_UID/SEQUENCE` for Alive
  and Suspect (which can repeat). A retry, a restart and a new leader send the same id.
- `type`: `dev.deathwatch.sandbox.alive|suspect|dead|gone`.
- `source`: `//deathwatch.dev/clusters/CLUSTER/namespaces/NAMESPACE`; `subject`: the pod
  (the SandboxVerdict's name); `time`: the verdict's (declared, for Dead; else when the state
  was entered).
- `sequence` (the CloudEvents sequence extension): the verdict's transition count, zero
  padded, so that a receiver can order what a slow network delivered late.
- `data`: the verdict document (`deathwatch explain -o json`: verdict_document.py).

Structured mode sends the whole event as `application/cloudevents+json`; binary mode puts
the attributes in `ce-*` headers and the document in the body. Either way the body is
signed per Standard Webhooks: `webhook-id` (the event's id), `webhook-timestamp` (seconds),
`webhook-signature` (`v1,` base64 HMAC-SHA256 of `id.timestamp.body`, one per key,
space-separated, so two keys sign at once while one rotates).
"""

from __future__ import annotations

import email.utils
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import msgspec
from standardwebhooks.webhooks import Webhook

from deathwatch._api.verdict_document import VerdictDocument
from deathwatch._engine.verdict import State
from deathwatch._kube import backoff

SPEC_VERSION = "1.0"
TYPES = {state: f"dev.deathwatch.sandbox.{state.value.lower()}" for state in State}
STRUCTURED = "application/cloudevents+json; charset=utf-8"
JSON = "application/json"
# seconds: a sink that failed is tried again after half to all of 0.5, 1, 2, then 3 s
# (`_kube.backoff.DELIVER`, jittered); its pause is the whole sink's, and while it fails one
# attempt (the probe) goes at a time, so a receiver back from an outage is found within
# PROBE_EVERY and drained at its own pace (#43: a minute's cap once left a backlog up to
# 57 s after the receiver was back)
PROBE_EVERY = backoff.DELIVER[-1]  # a sink down is probed this often
RETRY_AFTER_CAP = 3600.0  # a Retry-After longer than this is taken as this


def event_id(uid: str, state: State, sequence: int) -> str:
    if state.terminal:
        return f"{uid}/{state.value.lower()}"
    return f"{uid}/{sequence}"


def source(cluster: str, namespace: str) -> str:
    return f"//deathwatch.dev/clusters/{cluster}/namespaces/{namespace}"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One event to one sink, ready to send."""

    sink: str
    uid: str
    id: str
    type: str
    state: State
    sequence: int
    source: str
    subject: str
    time: datetime
    data: bytes  # the VerdictDocument's JSON


def outgoing(sink: str, cluster: str, doc: VerdictDocument, sequence: int,
             time: datetime) -> Outgoing:  # fmt: skip
    uid = doc.pod_uid or ""
    return Outgoing(
        sink=sink, uid=uid, id=event_id(uid, doc.state, sequence), type=TYPES[doc.state],
        state=doc.state, sequence=sequence, source=source(cluster, doc.namespace),
        subject=doc.pod, time=time, data=msgspec.json.encode(doc),
    )  # fmt: skip


def _time(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def attributes(out: Outgoing) -> dict[str, str]:
    return {
        "specversion": SPEC_VERSION,
        "id": out.id,
        "source": out.source,
        "type": out.type,
        "subject": out.subject,
        "time": _time(out.time),
        "datacontenttype": JSON,
        "sequence": f"{out.sequence:010d}",
    }


class _Structured(msgspec.Struct):
    specversion: str
    id: str
    source: str
    type: str
    subject: str
    time: str
    datacontenttype: str
    sequence: str
    data: msgspec.Raw


def request(
    out: Outgoing, mode: str, keys: Iterable[bytes], timestamp: int, user_agent: str
) -> tuple[dict[str, str], bytes]:
    """The headers and body of the POST that delivers `out`, signed with every key."""
    attrs = attributes(out)
    headers = {"User-Agent": user_agent}
    if mode == "binary":
        body = out.data
        headers.update({f"ce-{k}": v for k, v in attrs.items() if k != "datacontenttype"})
        headers["Content-Type"] = JSON
    else:
        body = msgspec.json.encode(_Structured(**attrs, data=msgspec.Raw(out.data)))
        headers["Content-Type"] = STRUCTURED
    headers["webhook-id"] = out.id
    headers["webhook-timestamp"] = str(timestamp)
    headers["webhook-signature"] = signature(keys, out.id, timestamp, body)
    return headers, body


def signature(keys: Iterable[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """Standard Webhooks' `webhook-signature`: `v1,<base64 HMAC-SHA256>` per key, each signed
    by the spec's own library (the one receivers verify with)."""
    at = datetime.fromtimestamp(timestamp, UTC)
    return " ".join(Webhook(key).sign(msg_id, at, body) for key in keys)


class Outcome(StrEnum):
    DELIVERED = "delivered"
    REFUSED = "refused"  # for good: recorded, counted, never sent again
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class Answer:
    outcome: Outcome
    reason: str  # a metric label: "2xx", "503", "connection", "timeout", ...
    retry_after: float | None = None  # seconds the receiver asked us to wait


def read_answer(status: int, headers: Mapping[str, str], now: datetime) -> Answer:
    """What a receiver's HTTP status means. 2xx: delivered. 408, 429 and 5xx: try again
    (after Retry-After when a 429 or 503 gives one). Any other 4xx, and a redirect (never
    followed: the URL is the operator's, not the receiver's, to change): refused for good."""
    if 200 <= status < 300:
        return Answer(Outcome.DELIVERED, "2xx")
    code = str(status)
    if status in (408, 429) or status >= 500:
        wait = retry_after(headers.get("Retry-After"), now) if status in (429, 503) else None
        return Answer(Outcome.RETRY, code, wait)
    return Answer(Outcome.REFUSED, code)


def retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), within
    [0, RETRY_AFTER_CAP]; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_CAP)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return min(max((when - now).total_seconds(), 0.0), RETRY_AFTER_CAP)


def retry_in(failures: int, rand: float) -> float:
    """The wait after a sink's `failures` failures in a row (`rand` in [0, 1)): the one
    backoff (`_kube.backoff.DELIVER`), jittered; never beyond PROBE_EVERY."""
    return backoff.jittered(backoff.DELIVER, failures, rand)
