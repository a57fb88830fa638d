#!/usr/bin/env python3
"""Regenerate the bundled sample recording and the test recordings (deterministic).

    python3 -m hack.make_recordings

Writes tests/data/sample-watch.json (the README demo's input until a cluster is at
hand) and tests/data/*.json[l]. Expected reports under tests/data are NOT regenerated here:
they were checked by hand against the scripts below; a change in them is a behaviour change.
"""

from __future__ import annotations

import json
import random
import sys
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from deathwatch._engine.timeutil import UTC
from hack.localcluster.sandbox_script import Fate, SandboxScript, recording

ROOT = Path(__file__).resolve().parent.parent

START = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
NS = uuid.UUID("6b1d2f4e-2c0e-4c55-9a53-6a3f9d1f0c11")


def script(name: str, at: float, **kw: Any) -> SandboxScript:
    return SandboxScript(
        name=name, uid=str(uuid.uuid5(NS, name)), start=START + timedelta(seconds=at), **kw
    )


def sample_fleet(rng: random.Random, n: int, prefix: str) -> list[SandboxScript]:
    fates = [
        (Fate.LIVES, "none", 10),
        (Fate.DELETED, "none", 12),
        (Fate.EXITS, "none", 4),
        (Fate.OOM, "none", 2),
        (Fate.COMPLETES, "none", 2),
        (Fate.EVICTED, "none", 1),
        (Fate.RESTARTS, "none", 1),
        (Fate.FLAPS, "exec", 3),
        (Fate.HANGS, "exec", 2),
        (Fate.LIVES, "exec", 2),
        (Fate.LIVES, "tcp", 1),
    ]
    weights = [w for *_, w in fates]
    out = []
    for i in range(n):
        fate, probe, _ = rng.choices(fates, weights)[0]
        out.append(
            script(
                f"{prefix}-{i:03d}",
                at=rng.uniform(0, 1800),
                fate=fate,
                probe=probe,
                life=timedelta(seconds=rng.uniform(30, 900)),
                exit_code=rng.choice([1, 2, 127, 139]),
                flaps=rng.randint(1, 3),
                flap_length=timedelta(seconds=rng.uniform(5, 40)),
                node=f"node-{rng.randint(1, 4)}",
            )
        )
    return out


def write_pretty(
    path: Path, scripts: list[SandboxScript], extra: Sequence[tuple[int, object]] = ()
) -> None:
    events = list(recording(scripts))
    for index, value in extra:
        events.insert(index, value)  # type: ignore[arg-type]
    # kubectl's -o json layout: 4-space indent, one object after another
    path.write_text("".join(json.dumps(e, indent=4) + "\n" for e in events))


def write_lines(path: Path, scripts: list[SandboxScript]) -> None:
    path.write_text(
        "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in recording(scripts))
    )


def main() -> None:
    tests = ROOT / "tests" / "data"
    tests.mkdir(exist_ok=True)
    write_pretty(tests / "sample-watch.json", sample_fleet(random.Random(7), 60, "sbx"))
    # A morning of no-probe sandboxes: every lifecycle the field notes describe.
    write_pretty(
        tests / "no-probe-morning.json",
        [
            script("live-a", 0),
            script("live-b", 5),
            script("exit-3", 10, fate=Fate.EXITS, exit_code=3, life=timedelta(seconds=120)),
            script("oom", 20, fate=Fate.OOM, life=timedelta(seconds=300)),
            script("evicted", 30, fate=Fate.EVICTED, life=timedelta(seconds=200)),
            script("deleted", 40, fate=Fate.DELETED, life=timedelta(seconds=60)),
            script("completed", 50, fate=Fate.COMPLETES, life=timedelta(seconds=90)),
            script("restarted", 60, fate=Fate.RESTARTS, life=timedelta(seconds=45)),
            script("node-lost", 70, fate=Fate.NODE_LOST, life=timedelta(seconds=500)),
        ],
    )
    # Exec-probe sandboxes: flaps within the window, one hang past it, one exit while Suspect
    # is not scripted (see test_engine); a late pod keeps the clock moving past the hang.
    write_lines(
        tests / "exec-probe-flaps.jsonl",
        [
            script(
                "flap-once",
                0,
                probe="exec",
                fate=Fate.FLAPS,
                flaps=1,
                flap_length=timedelta(seconds=30),
            ),
            script(
                "flap-thrice",
                5,
                probe="exec",
                fate=Fate.FLAPS,
                flaps=3,
                flap_length=timedelta(seconds=20),
                life=timedelta(seconds=600),
            ),
            script("hang", 10, probe="exec", fate=Fate.HANGS, life=timedelta(seconds=100)),
            script("tcp-blocked", 15, probe="tcp"),
            script("late", 400),
        ],
    )
    # The same morning with what real recordings also contain: a bookmark, a watch ERROR,
    # and objects with odd fields, which must be skipped and reported, never fatal.
    junk = [
        (
            3,
            {
                "type": "BOOKMARK",
                "object": {"kind": "Pod", "metadata": {"resourceVersion": "1003"}},
            },
        ),
        (
            6,
            {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "code": 410,
                    "reason": "Expired",
                    "message": "too old resource version: 1 (1002)",
                },
            },
        ),
        (
            9,
            {
                "type": "MODIFIED",
                "object": {
                    "kind": "Pod",
                    "metadata": {
                        "name": "odd",
                        "uid": "odd-1",
                        "namespace": "sandboxes",
                        "creationTimestamp": "yesterday",
                    },
                },
            },
        ),
        (
            12,
            {
                "type": "MODIFIED",
                "object": {
                    "kind": "Pod",
                    "metadata": {"name": "odd2", "uid": "odd-2", "namespace": "sandboxes"},
                    "status": {"containerStatuses": [{"name": "agent", "restartCount": "three"}]},
                },
            },
        ),
        (15, {"type": "ADDED", "object": {"kind": "Pod", "metadata": {"namespace": "sandboxes"}}}),
        (18, [1, 2, 3]),
    ]
    write_pretty(
        tests / "with-junk.json",
        [
            script("live-a", 0),
            script("exit-3", 10, fate=Fate.EXITS, exit_code=3, life=timedelta(seconds=120)),
            script("deleted", 40, fate=Fate.DELETED, life=timedelta(seconds=60)),
        ],
        junk,
    )


NFT_CONFIG = {
    "podCIDRs": ["10.244.0.0/16", "10.1.2.3/32", "fd00:10:244::/56"],
    "agentPorts": [49983, 8000],
    "allowedSources": ["10.0.5.0/24", "fd00:5::7/128"],
}
NFT_SANDBOXES = ("10.244.1.2", "10.244.1.7", "fd00:10:244:1::2")
NFT_HOSTS = ("10.244.2.0", "10.244.2.1", "10.244.9.77", "fd00:10:244:2::")  # tunnel addresses


def record_nft_listing(mode: str = "enforce") -> None:
    """`nft -j list table inet deathwatch` as this machine's nft prints it, after applying
    NFT_CONFIG (with NFT_SANDBOXES and NFT_HOSTS) in a throwaway network namespace and being refused 3 times
    (v4) and 2 (v6) by the output rule; `mode` audit: the same connections counted and
    recorded instead (nft-VERSION-audit-table.json).
    Needs root; tests/unit/test_firewall.py reduces the file and compares it with the model."""
    import ipaddress
    import subprocess

    from deathwatch.firewall.config import parse_config
    from deathwatch.firewall.ruleset import desired
    from deathwatch.firewall.table import script

    ns = "deathwatch-recording"

    def run(*args: str, stdin: str | None = None, check: bool = True) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", ns, *args],
            input=stdin, capture_output=True, text=True, check=check, timeout=30,
        ).stdout  # fmt: skip

    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        run("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")  # no dummy module
        run("ip", "link", "set", "d0", "up")
        run("ip", "link", "set", "d1", "up")
        run("ip", "addr", "add", "10.9.0.1/24", "dev", "d0")
        run("ip", "addr", "add", "fd00:9::1/64", "dev", "d0", "nodad")
        run("ip", "route", "add", "10.244.0.0/16", "dev", "d0")
        run("ip", "route", "add", "fd00:10:244::/56", "dev", "d0")
        sandboxes = [ipaddress.ip_address(a) for a in NFT_SANDBOXES]
        hosts = [ipaddress.ip_address(a) for a in NFT_HOSTS]
        config = parse_config({**NFT_CONFIG, "mode": mode})
        run("nft", "-f", "-", stdin=script(desired(config, sandboxes, hosts)))
        for addr, times in (("10.244.0.5", 3), ("fd00:10:244::5", 2)):
            for _ in range(times):
                run("busybox", "nc", "-w", "1", addr, "49983", stdin="", check=False)
        listing = json.loads(run("nft", "-j", "list", "table", "inet", "deathwatch"))
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)
    version = listing["nftables"][0]["metainfo"]["version"]
    which = "list" if mode == "enforce" else mode
    path = ROOT / "tests" / "data" / "nft" / f"nft-{version}-{which}-table.json"
    path.write_text(json.dumps(listing, indent=4) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--nft"]:
        record_nft_listing()
        record_nft_listing("audit")
    else:
        main()
