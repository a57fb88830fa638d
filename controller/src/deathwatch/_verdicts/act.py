"""The work of `deathwatch wait` and `deathwatch explain`: one client, one line on failure."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any, TextIO

import structlog
from kubernetes.config import ConfigException

from deathwatch._verdicts import explain as explaining
from deathwatch._verdicts.command import (
    EXIT_API,
    EXIT_BAD_INPUT,
    EXIT_NOT_REACHED,
    EXIT_OK,
    FOR,
    _target,
)
from deathwatch.client import ApiError, Client, NoAnswer, Unreachable, Verdict


class _CannotAsk(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _api_failure(command: str, exc: BaseException, err: TextIO) -> int:
    if isinstance(exc, ApiError):
        err.write(f"deathwatch {command}: the API server refused ({exc.status}): {exc.message}\n")
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


def wait(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
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
            except (ApiError, NoAnswer, OSError, TimeoutError) as exc:
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
    except (ApiError, NoAnswer, OSError) as exc:
        return _api_failure("wait", exc, err)
    cause = f" ({verdict.cause.value})" if verdict.cause else ""
    out.write(f"{namespace}/{verdict.pod} {verdict.state.value}{cause}\n")
    return EXIT_OK


def explain(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
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
    except (ApiError, NoAnswer, OSError, TimeoutError) as exc:
        return _api_failure("explain", exc, err)
    if verdict is None:
        what = f"Sandbox {namespace}/{pod}" if args.sandbox else f"{namespace}/{pod}"
        err.write(f"deathwatch explain: {what} has no verdict (no DeathWatch selects it)\n")
        return EXIT_NOT_REACHED
    doc = explaining.document(verdict, events)
    text = json.dumps(doc, indent=2) if args.output == "json" else explaining.text(doc)
    out.write(text + "\n")
    return EXIT_OK
