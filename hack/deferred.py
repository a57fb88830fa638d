"""The builds only a few tests need, run beside the lanes in a CI run of every lane (#60).

On a cold machine the version lane's four control planes, gVisor and the release's tools are
about half an hour of setup that the lanes would otherwise wait for before their first test.
`hack/test.sh` with no arguments names a directory in DEATHWATCH_DEFERRED; `hack/setup.sh`
then starts `hack/build-deferred.sh --record DIR ...` in a session of its own, which writes
each build's NAME.log and, when it ends, NAME.rc. A test that needs one calls `wait(NAME)`
first, and the modules that wait run last in their group (`LAST`, tests/conftest.py), so a
build has the lane's time. Without DEATHWATCH_DEFERRED, setup built them in turn and `wait`
returns at once. A failed build fails its tests with the build's last lines, never a skip."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ENV = "DEATHWATCH_DEFERRED"
BUILDS = ("gvisor", "release-tools", "k8s-matrix")  # hack/setup.sh: started in this order
# the test modules that wait for a build that is last in the chain: each runs last in its group
LAST = ("tests/apiserver/test_versions.py",)
WAIT_SECONDS = 75 * 60.0  # a cold machine's k8s-matrix beside both lanes: about 40 minutes
POLL_SECONDS = 2.0


class DeferredBuildFailed(RuntimeError):
    """A build beside the lanes failed, died without a status, or overran its wait."""


def _directory() -> Path | None:
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid(directory: Path) -> int | None:
    try:
        return int((directory / "pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {log})"


def status(name: str) -> int | None:
    """A deferred build's exit status once it has ended, else None (running, or not deferred)."""
    directory = _directory()
    if directory is None:
        return None
    try:
        return int((directory / f"{name}.rc").read_text().strip())
    except (OSError, ValueError):
        return None


def wait(name: str, timeout: float = WAIT_SECONDS) -> float:
    """Until the build `name` started beside the lanes has ended well; the seconds waited.
    Raises DeferredBuildFailed (naming the build and its log) if it failed, if its process
    ended without a status, or after `timeout`."""
    if name not in BUILDS:
        raise ValueError(f"no deferred build {name!r}; one of {BUILDS}")
    directory = _directory()
    if directory is None:
        return 0.0
    log = directory / f"{name}.log"
    started = time.monotonic()
    while True:
        rc = status(name)
        if rc == 0:
            return time.monotonic() - started
        if rc is not None:
            raise DeferredBuildFailed(f"the {name} build beside the lanes failed (exit {rc}); "
                                      f"the end of {log}:\n{_tail(log)}")  # fmt: skip
        pid = _pid(directory)
        # read the status again after the liveness check: it may have ended between the two
        if (pid is None or not _alive(pid)) and status(name) is None:
            raise DeferredBuildFailed(f"the {name} build beside the lanes is not running and "
                                      f"left no status (pid {pid}); see {log}")  # fmt: skip
        if time.monotonic() - started > timeout:
            raise DeferredBuildFailed(f"the {name} build beside the lanes has not ended in "
                                      f"{timeout:.0f} s; see {log}")  # fmt: skip
        time.sleep(POLL_SECONDS)


def report() -> list[str]:
    """One line per deferred build: its status and the last line of its log."""
    directory = _directory()
    if directory is None:
        return []
    lines = []
    for name in BUILDS:
        rc = status(name)
        last = _tail(directory / f"{name}.log", 1)
        lines.append(f"{name}: {'running' if rc is None else f'exit {rc}'} ({last.strip()})")
    return lines


def stop() -> None:
    """Ends builds still running (their session), as an interrupted run leaves nothing behind."""
    directory = _directory()
    pid = None if directory is None else _pid(directory)
    if pid is not None and any(status(name) is None for name in BUILDS):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
