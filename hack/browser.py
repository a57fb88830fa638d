"""Debian's Chromium, headless, as this machine's closed network needs it (no background
fetches, no first run, no sandbox as root): the documentation's pictures are taken with it.

    python3 -m hack.browser PAGE.html OUT.png WIDTH HEIGHT
"""

from __future__ import annotations

import shutil
import subprocess
import sys
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
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        f"--screenshot={out.resolve()}", f"file://{page.resolve()}"],
                       capture_output=True, timeout=120, check=False)  # fmt: skip
    if not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(f"chromium wrote no picture of {page}")


def ink(picture: Path) -> tuple[float, int]:
    """How much of a picture is inked, and in how many colours (coarsely): a page of plots
    has both; a blank or an error page has neither."""
    import matplotlib.image as mpimg
    import numpy as np

    rgb = (mpimg.imread(picture)[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    return float((rgb.min(axis=1) < 200).mean()), len(np.unique(rgb // 32, axis=0))


def main(argv: list[str]) -> int:
    if len(argv) != 4 or not all(a.isdigit() for a in argv[2:]):
        print("usage: python3 -m hack.browser PAGE.html OUT.png WIDTH HEIGHT", file=sys.stderr)
        return 2
    try:
        photograph(Path(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3]))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"browser: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
