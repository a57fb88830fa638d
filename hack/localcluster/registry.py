"""A private registry for the lanes, as a platform runs one: every pull needs credentials.

go-containerregistry's registry (in memory), behind HTTP basic auth (`hack/registry`, built
by hack/build-peers.sh into a directory keyed by its source), on a loopback address of the
host, where the node's containerd pulls from it over plain HTTP (containerd's rule for
localhost). Images come from the node itself: its imported images are tagged with the
registry's name and pushed by its own `ctr` (with the credentials), then the tag is removed
from the node, so that a pod naming it makes the kubelet pull it with the pod's pull secret.
The registry's log says every request: which pulls were refused, and which were served.

Once the kubelet has pulled an image from here, containerd 1.6's CRI no longer finds the same
image (one id) under the name it was imported with (`ctr` still lists it; a pod naming it
fails to pull it from a registry that does not exist), so a lane pulls from here last.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import select
import subprocess
from pathlib import Path
from typing import IO, Any

from hack.localcluster.node import Node

SOURCE = Path(__file__).resolve().parents[1] / "registry"
FILES = ("go.mod", "go.sum", "main.go")  # what the build is keyed by (build-peers.sh)
USER, PASSWORD = "lane", "not-a-secret-of-anyones"


def binary() -> Path:
    key = hashlib.sha256(b"".join((SOURCE / f).read_bytes() for f in FILES)).hexdigest()[:16]
    cache = Path(os.environ.get("DEATHWATCH_CACHE", Path.home() / ".cache" / "deathwatch"))
    return cache / "registry" / key / "registry"


def missing() -> str | None:
    """Why there is no private registry here, or None."""
    if not binary().exists():
        return f"{binary()} missing: run hack/build-peers.sh"
    return None


class Registry:
    def __init__(self, work: Path) -> None:
        self.log = work / "registry.log"
        self.proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self.host = ""  # 127.0.0.1:PORT, once started

    def start(self, timeout: float = 30) -> Registry:
        self._stderr = self.log.open("w")
        self.proc = subprocess.Popen(
            [str(binary()), "127.0.0.1:0", f"{USER}:{PASSWORD}"],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True,
        )  # fmt: skip
        stdout = self.proc.stdout
        # the one line it prints, once it listens: waited for with a deadline, never blocked on
        ready = stdout is not None and select.select([stdout], [], [], timeout)[0]
        line = stdout.readline() if ready and stdout is not None else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the registry did not start in {timeout} s: {line!r} "
                               f"{self.log.read_text()[-2000:]}")  # fmt: skip
        self.host = line.split()[-1]
        return self

    def push(self, node: Node, source: str, repository: str) -> str:
        """`source` (an image on the node) pushed as REGISTRY/`repository` with the
        credentials, its tag then removed from the node: a pod naming it must pull it."""
        ref = f"{self.host}/{repository}"
        node.ctr("images", "tag", "--force", source, ref)
        node.ctr("images", "push", "--plain-http", "--user", f"{USER}:{PASSWORD}", ref,
                 timeout=300)  # fmt: skip
        self.forget(node, ref)
        return ref

    @staticmethod
    def forget(node: Node, ref: str) -> None:
        """The node no longer has `ref` (its content stays, shared with the source)."""
        node.ctr("images", "rm", ref, check=False)

    def credentials(self) -> bytes:
        """What `docker login` writes for this registry (a pull secret's .dockerconfigjson)."""
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        entry = {"username": USER, "password": PASSWORD, "auth": auth}
        return json.dumps({"auths": {self.host: entry}}).encode()

    def pull_secret(self, name: str, namespace: str) -> dict[str, Any]:
        """The Secret a pod pulls from here with (kubernetes.io/dockerconfigjson)."""
        return {
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": name, "namespace": namespace},
            "data": {".dockerconfigjson": base64.b64encode(self.credentials()).decode()},
        }  # fmt: skip

    def served(self, repository: str) -> int:
        """Manifests of `repository` served so far (a pull resolves its manifest first)."""
        served = 0
        for line in self.log.read_text().splitlines():
            # "DATE TIME METHOD URL", and nothing after it when served (a status, when not)
            parts = line.split()
            served += len(parts) == 4 and parts[3].startswith(f"/v2/{repository}/manifests/")
        return served

    def refused(self) -> int:
        """Requests without the right credentials so far (containerd asks without first)."""
        return sum("refused " in x for x in self.log.read_text().splitlines())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._stderr is not None:
            self._stderr.close()
