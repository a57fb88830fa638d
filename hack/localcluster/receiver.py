"""A platform's webhook receiver, for the delivery lane and its benchmark: a real HTTP(S)
server that parses each request with the CloudEvents SDK and verifies it with the Standard
Webhooks library (the specs' own code, never deathwatch's), answers 204, and keeps what it
accepted, in arrival order. Faults are queued and served one request each:

    500 / 503          the status (503 with Retry-After when `retry_after` is given)
    429                with Retry-After
    reset              reads half the body, then resets the connection (SO_LINGER 0)
    slow               holds the request `delay` seconds, then 204 (the sender has given up:
                       a receiver that processed what its sender will send again)
    refuse             400 (for good)

`down()` closes the listening socket (connections refused) and `up()` opens it again on the
same port. TLS: `tls=True` makes a private CA (`ca_cert`) and a serving certificate for
127.0.0.1 signed by it (openssl), as an internal receiver would have.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cloudevents.v1.http import from_http
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from hack.localcluster.controlplane import free_port


@dataclass(frozen=True)
class Fault:
    kind: str  # 500, 503, 429, reset, slow, refuse
    retry_after: float | None = None
    delay: float = 0.0
    subject: str | None = None  # only for this subject (the others are served as usual)


@dataclass(frozen=True)
class Received:
    id: str
    type: str
    subject: str
    sequence: int
    source: str
    time: str
    data: dict[str, Any]
    at: float  # monotonic: when it was accepted
    mode: str  # structured or binary


@dataclass
class Receiver:
    secret: str  # whsec_...: the one key this receiver holds (mid-rotation: either of two)
    tls: bool = False
    host: str = "127.0.0.1"  # the address it listens on (the CNI bridge's, for pods)
    port: int = field(default_factory=free_port)
    received: list[Received] = field(default_factory=list)
    attempts: list[tuple[str, str]] = field(default_factory=list)  # (id or "?", what we did)
    invalid: list[str] = field(default_factory=list)  # requests that failed verification
    faults: deque[Fault] = field(default_factory=deque)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _open: set[socket.socket] = field(default_factory=set)
    _dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="receiver-")))

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/hooks/deathwatch"

    @property
    def ca_cert(self) -> Path:
        return self._dir / "ca.crt"

    def start(self) -> Receiver:
        if self.tls and not self.ca_cert.exists():
            _certificates(self._dir)
        self.up()
        return self

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return

            def setup(self) -> None:
                super().setup()
                with receiver._lock:
                    receiver._open.add(self.connection)

            def finish(self) -> None:
                with receiver._lock:
                    receiver._open.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                receiver._handle(self)

        server = ThreadingHTTPServer((self.host, self.port), Handler)
        server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self._dir / "server.crt", self._dir / "server.key")
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, name="receiver", daemon=True).start()

    def down(self) -> None:
        """Down: the port refuses, and the connections a sender keeps alive are cut too."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            open_now, self._open = list(self._open), set()
        for conn in open_now:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()

    def stop(self) -> None:
        self.down()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def fault(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    # --- what it saw ----------------------------------------------------------------------

    def ids(self) -> list[str]:
        with self._lock:
            return [r.id for r in self.received]

    def of(self, subject: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.subject == subject]

    def out_of_order(self) -> list[str]:
        """Subjects whose accepted events went backwards in sequence (a duplicate of the
        same id is not backwards)."""
        bad = []
        with self._lock:
            by: dict[str, list[Received]] = {}
            for r in self.received:
                by.setdefault(r.subject, []).append(r)
        for subject, events in by.items():
            highest = -1
            for r in events:
                if r.sequence < highest:
                    bad.append(subject)
                    break
                highest = max(highest, r.sequence)
        return bad

    def duplicates_with_other_ids(self) -> list[str]:
        """(subject, type) pairs delivered under more than one id: a stable id would have
        made them one."""
        with self._lock:
            seen: dict[tuple[str, str, int], set[str]] = {}
            for r in self.received:
                final = r.type.endswith((".dead", ".gone"))  # happens once to a pod
                key = (r.subject, r.type, 0 if final else r.sequence)
                seen.setdefault(key, set()).add(r.id)
        return [f"{k}: {sorted(v)}" for k, v in seen.items() if len(v) > 1]

    # --- one request ----------------------------------------------------------------------

    def _next_fault(self, subject: str | None) -> Fault | None:
        with self._lock:
            for i, f in enumerate(self.faults):
                if f.subject is None or f.subject == subject:
                    del self.faults[i]
                    return f
        return None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        headers = {k.lower(): v for k, v in h.headers.items()}
        subject = headers.get("ce-subject")
        fault = self._next_fault(subject) if subject else None
        if fault is None and not subject:  # structured: the subject is in the body
            body = h.rfile.read(length)
            try:
                subject = json.loads(body).get("subject")
            except ValueError:
                subject = None
            fault = self._next_fault(subject)
        else:
            body = b""
        if fault is not None and fault.kind == "reset":
            if not body:
                h.rfile.read(max(1, length // 2))
            self._note(headers.get("webhook-id") or "?", "reset")
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
            h.close_connection = True
            return
        if not body:
            body = h.rfile.read(length)
        msg_id = headers.get("webhook-id") or "?"
        if fault is not None and fault.kind in ("500", "503", "429", "refuse"):
            status = 400 if fault.kind == "refuse" else int(fault.kind)
            extra = (
                {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            )
            self._note(msg_id, str(status))
            self._answer(h, status, b'{"error": "injected"}', extra)
            return
        try:
            Webhook(self.secret).verify(body, headers, json_parse=False)
        except WebhookVerificationError as exc:
            with self._lock:
                self.invalid.append(f"{msg_id}: {exc}")
            self._answer(h, 401, b"bad signature", {})
            return
        event = from_http(dict(h.headers.items()), body)
        raw = event.get_data()
        data: dict[str, Any] = json.loads(raw) if isinstance(raw, bytes | str) else dict(raw or {})
        if fault is not None and fault.kind == "slow":
            time.sleep(fault.delay)
        received = Received(
            id=event["id"], type=event["type"], subject=event["subject"],
            sequence=int(event["sequence"]), source=event["source"], time=event["time"],
            data=data, at=time.monotonic(),
            mode="binary" if "ce-id" in headers else "structured",
        )  # fmt: skip
        with self._lock:
            self.received.append(received)
        self._note(received.id, "slow" if fault is not None else "204")
        self._answer(h, 204, b"", {})

    def _note(self, msg_id: str, what: str) -> None:
        with self._lock:
            self.attempts.append((msg_id, what))

    def attempts_of(self, msg_id: str) -> list[str]:
        with self._lock:
            return [what for i, what in self.attempts if i == msg_id]

    @staticmethod
    def _answer(h: BaseHTTPRequestHandler, status: int, body: bytes, extra: dict[str, str]) -> None:
        try:
            h.send_response(status)
            for k, v in extra.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except OSError:
            pass  # the sender gave up first (its deadline): what a slow receiver sees


def _certificates(d: Path) -> None:
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=receiver-private-ca")  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                  "extendedKeyUsage=serverAuth\n")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=receiver")  # fmt: skip
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext")  # fmt: skip


def sink_secret(path: Path, *secrets: str, ca: Path | None = None) -> Path:
    """A sink's Secret as the controller mounts it: `keys` (one whsec_ a line), `ca.crt`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "keys").write_text("".join(f"{s}\n" for s in secrets))
    if ca is not None:
        (path / "ca.crt").write_bytes(ca.read_bytes())
    return path
