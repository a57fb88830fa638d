"""`deathwatch wait` and `deathwatch explain` (also `kubectl deathwatch ...`).

wait exits 0 when the verdict reaches one of the states asked for, 1 when it timed out or
can no longer (a Gone pod can never be Dead), 2 on bad input, 3 when the API server could not
be asked (unreachable, or it refused: the message names its code). Always one line on stderr,
never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import sys
from typing import Any, TextIO

import aiohttp
import structlog
from kubernetes.config import ConfigException

from deathwatch._verdicts import explain
from deathwatch.client import ApiError, Client, State, Unreachable, Verdict

EXIT_OK, EXIT_NOT_REACHED, EXIT_BAD_INPUT, EXIT_API = 0, 1, 2, 3
FOR: dict[str, frozenset[State]] = {
    **{s.value.lower(): frozenset({s}) for s in State},
    "ended": frozenset({State.DEAD, State.GONE}),
}
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def duration(text: str) -> float:
    """ "60s", "2m", "1h30m", "90" (seconds)."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None:
        raise argparse.ArgumentTypeError(f"--timeout {text!r}: not a duration like 60s, 2m or 1h")
    h, m, s = (float(g) if g else 0.0 for g in match.groups())
    seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"--timeout {text!r}: must be more than 0")
    return seconds


def _target(args: argparse.Namespace) -> tuple[str, str]:
    """NS/POD, or POD with -n NS, or --sandbox NAME with -n NS; the names checked so a typo
    is one line, not a 404."""
    if (args.target is None) == (args.sandbox is None):
        raise ValueError("name one pod (NS/POD) or one agent-sandbox Sandbox (--sandbox NAME)")
    namespace, _, pod = (args.target or args.sandbox).rpartition("/")
    namespace = namespace or args.namespace
    what_pod = "sandbox" if args.sandbox else "pod"
    for what, value in (("namespace", namespace), (what_pod, pod)):
        if not _NAME.match(value) or len(value) > 253:
            raise ValueError(f"{what} {value!r} is not a Kubernetes name (NS/POD or -n NS POD)")
    return namespace, pod


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("target", metavar="NS/POD", nargs="?",
                        help="the sandbox pod (or POD with -n)")  # fmt: skip
    common.add_argument("--sandbox", metavar="NAME", default=None,
                        help="an agent-sandbox Sandbox: its current pod's verdict")  # fmt: skip
    common.add_argument("-n", "--namespace", default="default", help="when not in NS/POD")
    common.add_argument("--kubeconfig", default=None, help="else in-cluster, $KUBECONFIG, ~/.kube")
    w = subparsers.add_parser(
        "wait",
        parents=[common],
        help="wait until a pod's verdict reaches a state",
        description=(
            "Exit 0 when the verdict reaches the state, 1 when it timed out or can no longer "
            "(a Gone pod can never be Dead), 2 on bad input, 3 when the API server could not be "
            "asked."
        ),
    )
    w.add_argument("--for", dest="wanted", required=True, choices=sorted(FOR),
                   help="ended: Dead or Gone")  # fmt: skip
    w.add_argument("--timeout", type=duration, default=duration("30s"), help="default 30s")
    w.set_defaults(run=run_wait)
    e = subparsers.add_parser(
        "explain",
        parents=[common],
        help="a pod's verdict: cause, evidence, timeline, policy, shield and Events",
    )
    e.add_argument("-o", "--output", choices=("text", "json"), default="text")
    e.set_defaults(run=run_explain)


class _CannotAsk(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _api_failure(command: str, exc: BaseException, err: TextIO) -> int:
    if isinstance(exc, ApiError):
        said = exc.reason or ""
        with contextlib.suppress(ValueError):
            said = json.loads(exc.body).get("message") or said
        err.write(f"deathwatch {command}: the API server refused ({exc.status}): {said}\n")
    else:
        err.write(f"deathwatch {command}: cannot reach the API server: {exc!r}\n")
    return EXIT_API


def _prepare(args: argparse.Namespace, command: str, err: TextIO) -> tuple[str, str, Client] | int:
    """The target and a client, or the exit code of bad input (said in one line)."""
    try:
        namespace, pod = _target(args)
    except ValueError as exc:
        err.write(f"deathwatch {command}: {exc}\n")
        return EXIT_BAD_INPUT
    client = _client(args, command, err)
    return EXIT_BAD_INPUT if client is None else (namespace, pod, client)


def _client(args: argparse.Namespace, command: str, err: TextIO) -> Client | None:
    # a command's output is its answer: the client's retry logs only as warnings, on stderr
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(err),
    )
    try:
        return Client.from_kubeconfig(args.kubeconfig)
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        err.write(f"deathwatch {command}: no usable kubeconfig: {exc}\n")
        return None


def run_wait(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    ready = _prepare(args, "wait", err)
    if isinstance(ready, int):
        return ready
    namespace, pod, client = ready
    wanted = FOR[args.wanted]

    async def wait() -> Verdict:
        async with client:
            # one plain read first: an API server that cannot be asked is exit 3 at once,
            # not a wait that retries until its deadline
            try:
                await client.get(namespace, pod)
            except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise _CannotAsk(exc) from exc
            if args.sandbox:
                return await client.wait_for_sandbox(namespace, pod, wanted, args.timeout)
            return await client.wait_for(namespace, pod, wanted, args.timeout)

    try:
        verdict = asyncio.run(wait())
    except _CannotAsk as exc:
        return _api_failure("wait", exc.error, err)
    except Unreachable as exc:
        err.write(f"deathwatch wait: {exc}\n")
        return EXIT_NOT_REACHED
    except TimeoutError:
        err.write(f"deathwatch wait: {namespace}/{pod} not {args.wanted} after {args.timeout:g}s\n")
        return EXIT_NOT_REACHED
    except (ApiError, aiohttp.ClientError, OSError) as exc:
        return _api_failure("wait", exc, err)
    cause = f" ({verdict.cause.value})" if verdict.cause else ""
    out.write(f"{namespace}/{verdict.pod} {verdict.state.value}{cause}\n")
    return EXIT_OK


def run_explain(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    ready = _prepare(args, "explain", err)
    if isinstance(ready, int):
        return ready
    namespace, pod, client = ready

    async def read() -> tuple[Verdict | None, list[dict[str, Any]]]:
        async with client:
            if args.sandbox:
                verdict = await client.of_sandbox(namespace, pod)
            else:
                verdict = await client.get(namespace, pod)
            events = await client.events(namespace, verdict.pod) if verdict else []
            return verdict, events

    try:
        verdict, events = asyncio.run(read())
    except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as exc:
        return _api_failure("explain", exc, err)
    if verdict is None:
        what = f"Sandbox {namespace}/{pod}" if args.sandbox else f"{namespace}/{pod}"
        err.write(f"deathwatch explain: {what} has no verdict (no DeathWatch selects it)\n")
        return EXIT_NOT_REACHED
    doc = explain.document(verdict, events)
    out.write((json.dumps(doc, indent=2) if args.output == "json" else explain.text(doc)) + "\n")
    return EXIT_OK
