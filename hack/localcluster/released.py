"""The newest release, made from its tag exactly as a maintainer makes it (`hack/release.sh`
in a worktree of the tag, signed with a key made for it): once per tag commit, in the cache.
tests/deploy/test_release.py checks what it holds; the Helm lane installs it, then upgrades to
the working tree (docs/install.md "A release")."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from hack import deferred
from hack.localcluster.controlplane import cache_dir
from hack.release import tool

ROOT = Path(__file__).resolve().parent.parent.parent


class NoRelease(Exception):
    pass


def _git(*args: str, check: bool = True) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    if check and done.returncode != 0:
        raise NoRelease(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


RELEASES = ROOT / "hack" / "releases.txt"  # each release tag and its commit, a line each


def newest_tag() -> str:
    """The newest release tag HEAD descends from (v0.1.0 ...). A clone made without tags
    (a CI that fetches one branch) gets each one hack/releases.txt records, at its commit,
    which the clone has: a tag that is there must be at the commit the file says."""
    for line in RELEASES.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            tag, commit = line.split()
            found = _git("rev-parse", "-q", "--verify", f"refs/tags/{tag}^{{commit}}", check=False)
            if not found:
                _git("tag", tag, commit)
            elif found != commit:
                raise NoRelease(f"tag {tag} is at {found}; {RELEASES.name} says {commit}")
    return _git("describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", "HEAD")


def made(tag: str) -> Path:
    """The release of `tag`, made if this machine has not made it yet: its directory."""
    commit = _git("rev-parse", f"{tag}^{{commit}}")
    out = cache_dir() / "releases" / f"{tag}-{commit[:12]}"
    if (out / "SHA256SUMS.sigstore.json").exists():
        return out
    deferred.wait("release-tools")  # cosign and syft, when they build beside the lanes
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="release-") as tmp:
        worktree = Path(tmp) / "src"
        _git("worktree", "add", "--detach", str(worktree), tag)
        try:
            env = {**os.environ, "COSIGN_PASSWORD": secrets.token_hex(16)}
            subprocess.run([str(tool("cosign")), "generate-key-pair", "--output-key-prefix",
                            str(Path(tmp) / "release")], env=env, cwd=tmp, capture_output=True,
                           check=True, timeout=60)  # fmt: skip
            done = subprocess.run(
                [str(worktree / "hack" / "release.sh"), tag.removeprefix("v"), str(partial),
                 "--key", str(Path(tmp) / "release.key")],
                env=env, capture_output=True, text=True, timeout=3600, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise NoRelease(f"hack/release.sh at {tag}: {done.stderr.strip()[-2000:]}")
        finally:
            _git("worktree", "remove", "--force", str(worktree))
    partial.rename(out)
    return out
