"""The work of `deathwatch wait` and `deathwatch explain`: one client, one line on failure."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any, TextIO

import structlog

from deathwatch._api.kubeconfig import Loaded
from deathwatch._api.resources import GROUP, VERSION
from deathwatch._cli_api import cannot_ask, load
from deathwatch._verdicts import explain as explaining
from deathwatch._verdicts.asking import EXIT_BAD_INPUT, EXIT_NOT_REACHED, EXIT_OK, FOR, target
from deathwatch.client import ApiError, Client, NeverReached, NoAnswer, Verdict


class _CannotAsk(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _api_failure(
    command: str, exc: BaseException, loaded: Loaded, namespace: str, err: TextIO
) -> int:
    return cannot_ask(
        command, exc, loaded, err,
        forbidden=f"does not let {loaded.user or 'this user'} read SandboxVerdicts in "
        f"namespace {namespace}",
        missing_resource=f"does not serve SandboxVerdicts ({GROUP}/{VERSION}): deathwatch's "
        "CRDs are not installed",
    )  # fmt: skip


def _prepare(
    args: argparse.Namespace, command: str, err: TextIO
) -> tuple[str, str, Loaded, Client] | int:
    """The target and a client, or the exit code of what stopped it (said in one line)."""
    try:
        target(args)  # the names first: a typo is bad input whatever the kubeconfig says
    except ValueError as exc:
        err.write(f"deathwatch {command}: {exc}\n")
        return EXIT_BAD_INPUT
    # a command's output is its answer: the client's retry logs only as warnings, on stderr
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(err),
    )
    loaded = load(command, args.kubeconfig, args.context, err)
    if isinstance(loaded, int):
        return loaded
    namespace, pod = target(args, loaded.namespace)
    return namespace, pod, loaded, Client.from_loaded(loaded)


_FAILED = (ApiError, NoAnswer, OSError, TimeoutError)


def wait(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    ready = _prepare(args, "wait", err)
    if isinstance(ready, int):
        return ready
    namespace, pod, loaded, client = ready
    wanted = FOR[args.wanted]

    async def wait() -> Verdict:
        async with client:
            # one plain read first: an API server that cannot be asked is exit 3 at once,
            # not a wait that retries until its deadline
            try:
                await client.get(namespace, pod)
            except _FAILED as exc:
                raise _CannotAsk(exc) from exc
            if args.sandbox:
                return await client.wait_for_sandbox(namespace, pod, wanted, args.timeout)
            return await client.wait_for(namespace, pod, wanted, args.timeout)

    try:
        verdict = asyncio.run(wait())
    except _CannotAsk as exc:
        return _api_failure("wait", exc.error, loaded, namespace, err)
    except NeverReached as exc:
        err.write(f"deathwatch wait: {exc}\n")
        return EXIT_NOT_REACHED
    except TimeoutError:
        err.write(f"deathwatch wait: {namespace}/{pod} not {args.wanted} after {args.timeout:g}s\n")
        return EXIT_NOT_REACHED
    except _FAILED as exc:
        return _api_failure("wait", exc, loaded, namespace, err)
    cause = f" ({verdict.cause.value})" if verdict.cause else ""
    out.write(f"{namespace}/{verdict.pod} {verdict.state.value}{cause}\n")
    return EXIT_OK


def explain(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    ready = _prepare(args, "explain", err)
    if isinstance(ready, int):
        return ready
    namespace, pod, loaded, client = ready

    async def read() -> tuple[Verdict | None, list[dict[str, Any]], bool | None]:
        async with client:
            if args.sandbox:
                verdict = await client.of_sandbox(namespace, pod)
            else:
                verdict = await client.get(namespace, pod)
            if verdict is None:
                exists = None if args.sandbox else await client.pod_exists(namespace, pod)
                return None, [], exists
            return verdict, await client.events(namespace, verdict.pod), True

    try:
        verdict, events, exists = asyncio.run(read())
    except _FAILED as exc:
        return _api_failure("explain", exc, loaded, namespace, err)
    if verdict is None:
        err.write(f"deathwatch explain: {_no_verdict(args, namespace, pod, exists)}\n")
        return EXIT_NOT_REACHED
    doc = explaining.document(verdict, events)
    text = json.dumps(doc, indent=2) if args.output == "json" else explaining.text(doc)
    out.write(text + "\n")
    return EXIT_OK


def _no_verdict(args: argparse.Namespace, namespace: str, name: str, exists: bool | None) -> str:
    """Which object is missing: the pod, or only its verdict (and what selects one)."""
    selects = (
        f"no DeathWatch in namespace {namespace} selects it "
        f"(kubectl get deathwatches -n {namespace})"
    )
    if args.sandbox:
        return f"Sandbox {namespace}/{name} has no verdict: no pod of it is judged, or {selects}"
    if exists is False:
        return (
            f"pod {namespace}/{name} not found, and no verdict for it (a verdict outlives its pod "
            "by the DeathWatch's verdictRetention, 1h by default)"
        )
    if exists is None:
        return f"{namespace}/{name} has no verdict: no such pod, or {selects}"
    return f"pod {namespace}/{name} has no verdict: {selects}, or it is too new to be judged"
