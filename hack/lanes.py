"""Every lane, in two pytest processes at once (`hack/test.sh` with no arguments).

    python3 -m hack.lanes [pytest args...]    # the args go to both processes

The two groups share nothing a test holds:
    node    tests/node, tests/deploy: each brings up the one local node this machine has
            (hack/localcluster/node.py, MACHINE_LOCK), so they run one after another
    rest    every other folder: control planes on free ports, network namespaces of their
            own, promtool, chromium

Most of a real lane's time is waiting on what it proves (a Lease to expire, an alert's
`for:`, a rollout), not on the CPU, so the two overlap where one process would wait twice
(docs/adr/0041: the measured times, and what was rejected).

The rest streams to this terminal as it runs; the node group's output goes to a file and is
printed whole when both are done, so neither interleaves with the other. Each group writes
its JUnit XML beside its temporary directory. The exit status is 0 only if both passed. An
interrupt (SIGINT, SIGTERM) is passed on to both as SIGINT, so each runs its teardowns (a
local node left running would hold the machine's lock for the next run)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from hack import deferred

ROOT = Path(__file__).resolve().parent.parent
NODE_LANES = ("tests/node", "tests/deploy")
GROUPS: dict[str, list[str]] = {
    "node": list(NODE_LANES),
    "rest": ["tests", *(f"--ignore={lane}" for lane in NODE_LANES)],
}
KEEP_RUNS = 3  # earlier runs' temporary directories kept, as pytest keeps its own
TEARDOWN_SECONDS = 120.0  # after an interrupt, how long each group has for its teardowns


@dataclass
class Group:
    name: str
    args: list[str]
    tmp: Path
    live: bool  # its output to this terminal as it runs, or to a file printed after
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    took: float = 0.0

    @staticmethod
    def start(name: str, args: list[str], tmp: Path, extra: list[str]) -> Group:
        live = name == "rest"
        command = [
            sys.executable, "-m", "pytest", *args,
            f"--basetemp={tmp / name}", f"--junitxml={tmp / f'{name}.xml'}", *extra,
        ]  # fmt: skip
        out: IO[bytes] | None = None if live else (tmp / f"{name}.log").open("wb")
        # its own session: an interrupt reaches it through us alone, once
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )  # fmt: skip
        if out is not None:
            out.close()
        print(f"[lanes] {name}: {' '.join(args)} (pid {process.pid})", flush=True)
        return Group(name, args, tmp, live, process)

    @property
    def log(self) -> Path:
        return self.tmp / f"{self.name}.log"

    @property
    def junit(self) -> Path:
        return self.tmp / f"{self.name}.xml"

    def interrupt(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)

    def poll(self) -> int | None:
        """Its exit status once it has ended (and how long it took), else None."""
        code = self.process.poll()
        if code is not None and not self.took:
            self.took = time.monotonic() - self.started
        return code

    def kill_after(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)


def _prune(parent: Path, keep: int) -> None:
    """Earlier runs' directories beyond the newest `keep`."""
    runs = sorted(parent.glob("dw-lanes-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in runs[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def main(extra: list[str]) -> int:
    parent = Path(tempfile.gettempdir())
    _prune(parent, KEEP_RUNS - 1)
    tmp = Path(tempfile.mkdtemp(prefix="dw-lanes-", dir=parent))
    groups: list[Group] = []

    def interrupted(signum: int, _frame: FrameType | None) -> None:
        print(f"[lanes] signal {signum}: interrupting both groups", flush=True)
        deferred.stop()
        for group in groups:
            group.interrupt()
        for group in groups:
            group.kill_after(TEARDOWN_SECONDS)
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    for name, args in GROUPS.items():
        groups.append(Group.start(name, args, tmp, extra))
    while any(group.poll() is None for group in groups):
        time.sleep(1)
    codes = {group.name: group.poll() for group in groups}
    for group in groups:
        if not group.live:
            print(f"\n[lanes] ===== {group.name}: {' '.join(group.args)} =====", flush=True)
            sys.stdout.buffer.write(group.log.read_bytes())
            sys.stdout.flush()
    print("", flush=True)
    for group in groups:
        print(
            f"[lanes] {group.name}: exit {codes[group.name]} in {group.took / 60:.1f} min"
            f" (JUnit {group.junit})",
            flush=True,
        )
    # the builds beside the lanes (hack/deferred.py): a failed one fails the run even where no
    # test selected waited for it; one still running is ended, as no test is left to need it
    built = [deferred.status(name) for name in deferred.BUILDS]
    for line in deferred.report():
        print(f"[lanes] built beside the lanes: {line}", flush=True)
    deferred.stop()
    failed = any(rc not in (None, 0) for rc in built)
    return 0 if all(code == 0 for code in codes.values()) and not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
