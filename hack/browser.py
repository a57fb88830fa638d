"""Debian's Chromium, headless, as this machine's closed network needs it (no background
fetches, no first run, no sandbox as root): the README's pictures are taken with it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")  # fmt: skip


def chromium() -> str | None:
    return shutil.which("chromium")


def photograph(page: Path, out: Path, width: int, height: int) -> None:
    """A screenshot of a local page; raises RuntimeError if Chromium wrote none."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium not found (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        f"--screenshot={out}", f"file://{page}"],
                       capture_output=True, timeout=120, check=False)  # fmt: skip
    if not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no picture of {page}")
