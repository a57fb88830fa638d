"""The documentation's pictures, taken in a real headless Chromium (Debian's), as hack/screenshots.sh
takes them: the replay report of a recording of the cluster's own deaths, rendered by the
browser (its DOM holds every plot) and photographed (the picture holds them too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hack import browser

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "disruptions.json"


@pytest.fixture
def chromium() -> str:
    found = browser.chromium()
    if found is None:
        pytest.skip("chromium not installed (hack/setup.sh installs Debian's)")
    return found


def test_the_browser_renders_every_plot_of_the_replay_report(chromium: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "deathwatch._cli", "replay", str(RECORDING),
                           "--format", "html"], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr
    page.write_text(done.stdout)
    dom = subprocess.run([chromium, *browser.FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", f"file://{page}"], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    # what the browser built, not what we wrote: one plot per section, each with its marks
    assert dom.stdout.count("<svg") >= 5, dom.stdout[:2000]
    for heading in (
        "Pods over time",
        "Each policy on this recording",
        "Deaths per cause",
        "Deaths per node",
    ):
        assert heading in dom.stdout, heading


def test_the_readme_screenshot_is_taken_by_the_script_in_a_real_browser(
    chromium: str, tmp_path: Path
) -> None:
    done = subprocess.run([str(ROOT / "hack" / "screenshots.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    import matplotlib.image as mpimg

    height, width = mpimg.imread(tmp_path / "replay-report.png").shape[:2]
    assert (width, height) == (1150, 2700)
    # a page of plots, not a blank or an error page: much of it inked, in several colours
    inked, colours = browser.ink(tmp_path / "replay-report.png")
    assert inked > 0.03 and colours > 12, (inked, colours)
