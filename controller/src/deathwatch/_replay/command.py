"""`deathwatch replay FILE`: the command-line shell around the replay core."""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO, TextIO

from deathwatch._kube.selector import SelectorError, parse_selector
from deathwatch._policies import AUTO, PolicySettings, UnknownPolicy, default_registry
from deathwatch._policies.builtin import BUILTIN_ORDER
from deathwatch._replay.events import DECODER, SkippedEvent, ViewEvent, view_events
from deathwatch._replay.html import MissingPlotting, Timelines, page
from deathwatch._replay.parallel import ParallelEvents, regular_file
from deathwatch._replay.render import render_json, render_table
from deathwatch._replay.run import Replay
from deathwatch._replay.stream import StreamError, read_values

EXIT_BAD_INPUT = 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "replay",
        help="evaluate death policies on a recorded `kubectl get pods --watch` stream",
        description=(
            "Read what `kubectl get pods --watch --output-watch-events -o json` wrote (or JSON "
            "Lines of the same events; bare Pods count as MODIFIED) and report what each death "
            "policy would have concluded."
        ),
    )
    p.add_argument("file", help="the recording, or - for standard input")
    p.add_argument("--selector", "-l", default=None, help="label selector: k=v[,k!=v,k,!k]")
    p.add_argument(
        "--policy",
        default=AUTO,
        help="auto (per pod: no-probe, exec-probe, container-state), or a policy name",
    )
    p.add_argument(
        "--exec-window-multiplier",
        type=_positive_float,
        default=PolicySettings().exec_window_multiplier,
        metavar="X",
        help="exec-probe window W = X * (failureThreshold*periodSeconds + timeoutSeconds)",
    )
    p.add_argument(
        "--agent-port",
        type=_port,
        action="append",
        default=[],
        metavar="PORT",
        help="an agent port the node firewall refuses (flags network probes on it); repeatable",
    )
    p.add_argument("--format", choices=("table", "json", "html"), default="table",
                   help="html: one self-contained page of plots (pods over time, each "
                   "policy side by side, delays, deaths per cause and node); needs "
                   "deathwatch[report]")  # fmt: skip
    p.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="worker processes decoding a file (default: one per core but one, for files over "
        f"{PARALLEL_MIN_BYTES >> 20} MB on {PARALLEL_MIN_CORES} cores or more, else none; stdin "
        "is read in-process); the verdicts are the same either way",
    )
    p.set_defaults(run=run)


PARALLEL_MIN_BYTES = 16 << 20
PARALLEL_MIN_CORES = 4


def default_jobs(size: int, cores: int) -> int:
    """Worker processes for a file of `size` bytes on `cores` cores: none below
    PARALLEL_MIN_BYTES, and none on fewer than PARALLEL_MIN_CORES cores, where the judging
    process must share a core with the workers and the results' round trip through a pipe
    (msgpack out, msgpack in) costs more than it saves: on 2 cores a 52,000-event recording
    took 1.16 s in-process against 1.31 s with two workers (docs/adr/0018). Else one per core
    but the judging one's."""
    if size < PARALLEL_MIN_BYTES or cores < PARALLEL_MIN_CORES:
        return 0
    return cores - 1


def _jobs(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"not a number of workers (0-64): {text!r}")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port (1-65535): {text!r}")
    return int(text)


class _Counting(io.RawIOBase):
    """Counts the bytes read through it, for the progress line."""

    def __init__(self, inner: BinaryIO) -> None:
        self.inner = inner
        self.count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.count += len(data)
        return data


class _Progress:
    """A one-line progress indicator on a terminal; silent otherwise."""

    def __init__(self, err: TextIO, total: int | None) -> None:
        self.enabled = err.isatty()
        self.err = err
        self.total = total
        self.started = self.last = time.monotonic()

    def update(self, offset: int, events: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < 0.5:
            return
        self.last = now
        rate = events / max(now - self.started, 1e-9)
        share = f" {100 * offset / self.total:5.1f}%" if self.total else ""
        self.err.write(
            f"\rreplay:{share} {offset / 1e6:,.0f} MB, {events:,} events, {rate:,.0f}/s "
        )
        self.err.flush()

    def done(self) -> None:
        if self.enabled and self.last != self.started:
            self.err.write("\r\033[K")
            self.err.flush()


def _open(path: str) -> tuple[BinaryIO, int | None]:
    if path == "-":
        return sys.stdin.buffer, None
    stream = open(path, "rb")  # noqa: SIM115 - closed by run()
    size = os.fstat(stream.fileno()).st_size
    return stream, size or None


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    registry = default_registry()
    try:
        registry.validate(args.policy)
        selector = parse_selector(args.selector) if args.selector else None
    except (UnknownPolicy, SelectorError) as exc:
        err.write(f"deathwatch replay: {exc}\n")
        return EXIT_BAD_INPUT
    settings = PolicySettings(
        exec_window_multiplier=args.exec_window_multiplier,
        agent_ports=frozenset(args.agent_port),
    )
    replay = Replay(registry, args.policy, settings, selector)
    # html: the same events judged by each built-in policy alone too, and the pods' timelines
    others = {
        name: Replay(registry, name, settings, selector)
        for name in (p.name for p in BUILTIN_ORDER)
    } if args.format == "html" else {}  # fmt: skip
    timelines = Timelines() if args.format == "html" else None
    try:
        stream, size = _open(args.file)
    except OSError as exc:
        err.write(f"deathwatch replay: cannot read {args.file}: {exc.strerror or exc}\n")
        return EXIT_BAD_INPUT
    progress = _Progress(err, size)
    jobs = args.jobs
    if jobs is None:
        jobs = default_jobs(size or 0, os.cpu_count() or 1)
    events: Iterator[ViewEvent | SkippedEvent]
    fd = regular_file(stream)
    position: Callable[[], int]
    if jobs > 0 and fd is not None:
        parallel = ParallelEvents(fd, jobs)
        events, position = iter(parallel), lambda: parallel.position
    else:
        counting = _Counting(stream)
        events = view_events(read_values(counting, decode=DECODER.decode))  # type: ignore[arg-type]
        position = lambda: counting.count  # noqa: E731
    try:
        for n, event in enumerate(events):
            steps = replay.feed(event)
            if timelines is not None:
                timelines.observe(event, steps, replay.clock)
                for other in others.values():
                    other.feed(event)
            if n & 1023 == 0:
                progress.update(position(), replay.events)
    except StreamError as exc:
        progress.done()
        err.write(f"deathwatch replay: {args.file}: {exc}; no report, the input is incomplete\n")
        return EXIT_BAD_INPUT
    except OSError as exc:
        progress.done()
        err.write(f"deathwatch replay: reading {args.file}: {exc}\n")
        return EXIT_BAD_INPUT
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    progress.done()
    report = replay.finish()
    name = "stdin" if args.file == "-" else args.file
    if timelines is not None:
        try:
            text = page(report, timelines, {k: r.finish() for k, r in others.items()}, name)
        except MissingPlotting as exc:
            err.write(f"deathwatch replay: {exc}\n")
            return EXIT_BAD_INPUT
        out.write(text)
    else:
        out.write(
            render_json(report) + "\n" if args.format == "json" else render_table(report, name)
        )
    if report.skipped.count:
        err.write(
            f"deathwatch replay: skipped {report.skipped.count} object(s) with missing or odd "
            f"fields; first: {report.skipped.examples[0]}\n"
        )
    return 0
