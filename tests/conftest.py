"""Suite-wide rules. In CI (CI=true) a skipped test that needs a real component is a failure:
a missing install step must not hide behind a skip."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

ENFORCED_IN_CI = ("apiserver", "netns", "node")
_skipped_real: list[str] = []


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped:
        marks = [m for m in ENFORCED_IN_CI if item.get_closest_marker(m)]
        if marks:
            reason = (
                report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            )
            _skipped_real.append(f"{item.nodeid} [{','.join(marks)}]: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped_real and in_ci():
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("")
            reporter.write_line(
                f"CI: {len(_skipped_real)} test(s) needing real components were skipped:", red=True
            )
            for line in _skipped_real[:20]:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
