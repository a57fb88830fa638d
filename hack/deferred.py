"""The builds only a few tests need, run beside the lanes in a CI run of every lane (#60).

On a cold machine the version lane's four control planes, gVisor and the release's tools are
about half an hour of setup that the lanes would otherwise wait for before their first test.
`hack/test.sh` with no arguments names a directory in DEATHWATCH_DEFERRED; `hack/setup.sh`
then starts `hack/build-deferred.sh --record DIR NAME` for each, at once, each in a session of
its own at the lowest priority, which writes NAME.pid, NAME.log and, when it ends, NAME.rc. The
modules that need one (`NEEDED_BY`) wait for it before their first test, outside its timeout
(tests/conftest.py), and the version lane's module runs last in its group (`LAST`), so the
longest build has the lane's time. Without DEATHWATCH_DEFERRED, setup built them in turn and
`wait` returns at once. A failed build fails its tests with the build's last lines, never a
skip."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

ENV = "DEATHWATCH_DEFERRED"
# each build, and the test modules that need it (their first test waits)
NEEDED_BY: dict[str, tuple[str, ...]] = {
    "gvisor": ("tests/node/test_agent_sandbox.py", "tests/node/test_gvisor.py"),
    "release-tools": ("tests/deploy/test_helm_lane.py", "tests/deploy/test_quickstart.py",
                      "tests/deploy/test_release.py"),
    "k8s-matrix": ("tests/apiserver/test_versions.py",),
}  # fmt: skip
BUILDS = tuple(NEEDED_BY)
# the modules that wait for the longest build: each runs last in its group
LAST = NEEDED_BY["k8s-matrix"]
WAIT_SECONDS = 75 * 60.0  # a cold machine's k8s-matrix beside both lanes: about 25 minutes
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


def _pid(directory: Path, name: str) -> int | None:
    try:
        return int((directory / f"{name}.pid").read_text().strip())
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
        pid = _pid(directory, name)
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


def needed(module: Path, root: Path) -> tuple[str, ...]:
    """The builds the test module at `module` needs (paths under `root`)."""
    try:
        relative = module.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return ()
    return tuple(name for name, modules in NEEDED_BY.items() if relative in modules)


def stop() -> None:
    """Ends builds still running (each one's session), as an interrupted run leaves nothing
    behind."""
    directory = _directory()
    if directory is None:
        return
    for name in BUILDS:
        pid = _pid(directory, name)
        if pid is not None and status(name) is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
