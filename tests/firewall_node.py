"""A firewall agent as a process on a node of its own: a network namespace for its nft, the
agent in this machine's network namespace (so it reaches the API on 127.0.0.1, and its port
is reachable there), under the firewall's ServiceAccount token. For the netns lanes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class FirewallNode:
    """A node's network namespace and its firewall agent, running in this machine's network
    namespace (so it reaches the API on 127.0.0.1) with nft acting in the node's."""

    def __init__(self, name: str, tmp: Path, config: Path, api: str, token: Path, ca: Path,
                 metrics_port: int = 0, pythonpath: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.name, self.netns = name, f"dw-{name}-{uuid.uuid4().hex[:6]}"
        self.log = tmp / f"agent-{name}.log"
        self.nft = tmp / f"nft-{name}"
        self.nft.write_text(f'#!/bin/sh\nexec ip netns exec {self.netns} nft "$@"\n')
        self.nft.chmod(0o755)
        self.args = [
            sys.executable, "-m", "deathwatch.firewall.cli", "agent", "--config", str(config),
            "--node-name", name, "--identity", f"fw-{name}", "--namespace", "deathwatch-system",
            "--kube-api", api, "--kube-token-file", str(token), "--kube-ca-file", str(ca),
            "--nft", str(self.nft), "--metrics-port", str(metrics_port),
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.pythonpath = (*pythonpath, *sys.path)  # first: another revision's code (benches)
        subprocess.run(["ip", "netns", "add", self.netns], check=True, timeout=30)

    def start(self) -> None:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(self.pythonpath)},
            )  # fmt: skip

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)

    def sandbox_set(self) -> str:
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, "nft", "list", "set", "inet", "deathwatch",
             "sandbox_v4"], capture_output=True, text=True, timeout=30, check=False,
        ).stdout  # fmt: skip

    def destroy(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        subprocess.run(["ip", "netns", "del", self.netns], check=False, timeout=30)
