"""A platform's receiver of deathwatch verdicts, in Python (docs/delivery.md's example; the
delivery lane runs it against the controller).

    DEATHWATCH_SECRET=whsec_... PORT=8080 python3 receiver.py

Each request is verified (Standard Webhooks: `pip install standardwebhooks`), parsed as a
CloudEvent (`pip install cloudevents`), and handled once per event id: deathwatch delivers at
least once, so a retry, or a re-send by a new leader after a failover, carries the id it had.
Answer 2xx only once the event is handled (recorded durably): anything else is sent again.
A 4xx other than 408 and 429 is taken as "never send this again".
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cloudevents.v1.http import from_http
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

WEBHOOK = Webhook(os.environ["DEATHWATCH_SECRET"])
SEEN: set[str] = set()  # in production: a table whose primary key is the event id
LOCK = threading.Lock()


def act(kind: str, verdict: dict[str, object]) -> None:
    """Your platform's part: reclaim, bill (by `origin`), tell the user, replace the sandbox."""
    print(f"handled {kind} {verdict['namespace']}/{verdict['pod']} cause={verdict['cause']} "
          f"origin={verdict['origin']}", flush=True)  # fmt: skip


def handle(headers: dict[str, str], body: bytes) -> int:
    try:
        WEBHOOK.verify(body, headers, json_parse=False)  # signature, and a fresh timestamp
    except WebhookVerificationError:
        return 401
    event = from_http(headers, body)  # structured or binary mode, either
    data = event.get_data()
    verdict: dict[str, object] = json.loads(data) if isinstance(data, bytes | str) else data or {}
    with LOCK:  # one handling per id, however many times it comes
        if event["id"] in SEEN:
            print(f"duplicate {event['id']}", flush=True)
            return 204
        act(event["type"].rsplit(".", 1)[1], verdict)
        SEEN.add(event["id"])
        print(f"id {event['id']} sequence {event['sequence']}", flush=True)
    return 204


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status = handle({k.lower(): v for k, v in self.headers.items()}, body)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Handler).serve_forever()
