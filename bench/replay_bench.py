#!/usr/bin/env python3
"""Replay throughput and memory, each against a baseline run in the same invocation.

    python3 -m bench.replay_bench [--pods N] [--rounds R] [--json]
    python3 -m bench.replay_bench --whole [--against REV ...] [--rounds R]

Builds a recording of N sandboxes (every fate, no-probe and exec-probe) in kubectl's
pretty-printed layout, then measures:

- baseline: json.JSONDecoder.raw_decode alone, the parser we would have without msgspec;
- the stream reader alone (boundaries + typed msgspec decode), events/s;
- replay in-process (reader + engine + report), and its ratio to the baseline;
- replay with worker processes (`--jobs`, default one per core), and its ratio to in-process;
for two pod sizes: lean (what the API returns for a minimal pod, ~3.5 KB pretty-printed) and
rich (padded with env, volumes, tolerations, owner references like a production pod, ~9 KB);
- memory: peak traced allocation of replay for N pods with few events each vs the same N pods
  with R times as many events (must stay flat: memory follows pods, not file size), and for
  2N pods (should about double).

`--whole` measures what a user waits for instead: the whole `deathwatch replay FILE` process
(interpreter start, imports, reading, judging, the report), best of R, on three recordings of
about 52,000 events each (JSON Lines: one of every fate, one of exec-probe pods that flap
eight times; and the first as kubectl writes it, pretty-printed), for this checkout and for each `--against` revision (a git worktree of it,
run by the same interpreter), the rounds interleaved so that a noisy machine treats them
alike. Issue #29 asked for replay faster than before the reshape (bb41d74).
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from deathwatch._policies import AUTO, PolicySettings, default_registry
from deathwatch._replay.events import DECODER, view_events
from deathwatch._replay.parallel import ParallelEvents, regular_file
from deathwatch._replay.run import Replay
from deathwatch._replay.stream import read_values
from hack.localcluster.sandbox_script import Fate, SandboxScript, recording

START = datetime(2026, 11, 29, 0, 0, 0, tzinfo=UTC)
PADDING: dict[str, Any] = {
    "env": [{"name": f"SANDBOX_VAR_{i}", "value": "x" * 24} for i in range(8)]
    + [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sandbox-token", "key": "token"}}}],
    "volumeMounts": [
        {
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            "name": "kube-api-access",
            "readOnly": True,
        },
        {"mountPath": "/workspace", "name": "workspace"},
    ],
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
}
SPEC_PADDING: dict[str, Any] = {
    "dnsPolicy": "ClusterFirst",
    "enableServiceLinks": True,
    "preemptionPolicy": "PreemptLowerPriority",
    "priority": 0,
    "schedulerName": "default-scheduler",
    "securityContext": {},
    "serviceAccount": "default",
    "serviceAccountName": "default",
    "tolerations": [
        {
            "effect": "NoExecute",
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "tolerationSeconds": 300,
        },
        {
            "effect": "NoExecute",
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "tolerationSeconds": 300,
        },
    ],
    "volumes": [
        {
            "name": "kube-api-access",
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {
                        "configMap": {
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            "name": "kube-root-ca.crt",
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "fieldRef": {
                                        "apiVersion": "v1",
                                        "fieldPath": "metadata.namespace",
                                    },
                                    "path": "namespace",
                                }
                            ]
                        }
                    },
                ],
            },
        },
        {"name": "workspace", "emptyDir": {"sizeLimit": "10Gi"}},
    ],
}


def fleet(n: int, seed: int, flaps: int = 1) -> list[SandboxScript]:
    rng = random.Random(seed)
    kinds = [
        (Fate.LIVES, "none"),
        (Fate.DELETED, "none"),
        (Fate.DELETED, "none"),
        (Fate.EXITS, "none"),
        (Fate.OOM, "none"),
        (Fate.COMPLETES, "none"),
        (Fate.FLAPS, "exec"),
        (Fate.HANGS, "exec"),
    ]
    out = []
    for i in range(n):
        fate, probe = rng.choice(kinds)
        if flaps > 1:
            fate, probe = Fate.FLAPS, "exec"
        out.append(
            SandboxScript(
                name=f"sbx-{i:06d}",
                uid=str(uuid.UUID(int=rng.getrandbits(128))),
                start=START + timedelta(seconds=rng.uniform(0, 86400)),
                fate=fate,
                probe=probe,  # type: ignore[arg-type]
                flaps=flaps,
                flap_length=timedelta(seconds=5),
                life=timedelta(seconds=rng.uniform(60, 3600)),
                labels={
                    "app": "sandbox",
                    "sandbox.dev/tenant": f"t{rng.randint(1, 50)}",
                    "pod-template-hash": "7d9c5b",
                },
            )
        )
    return out


def render(scripts: list[SandboxScript]) -> bytes:
    parts = []
    for event in recording(scripts):
        obj = event["object"]
        obj["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "sbx",
                "uid": "0d6c3f1e-0000-4000-8000-000000000000",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        obj["spec"].update(copy.deepcopy(SPEC_PADDING))
        obj["spec"]["containers"][0].update(copy.deepcopy(PADDING))
        parts.append(json.dumps(event, indent=4))
    return ("\n".join(parts) + "\n").encode()


def time_best(fn: Any, rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def run_replay(data: bytes | Path, jobs: int = 0) -> int:
    """The replay command's work, with `jobs` worker processes (files only)."""
    replay = Replay(default_registry(), AUTO, PolicySettings())
    if isinstance(data, Path):
        with data.open("rb") as stream:
            fd = regular_file(stream)
            assert fd is not None
            events = (
                ParallelEvents(fd, jobs)
                if jobs
                else view_events(read_values(stream, decode=DECODER.decode))
            )
            for event in events:
                replay.feed(event)
        return replay.finish().events
    for event in view_events(read_values(io.BytesIO(data), decode=DECODER.decode)):
        replay.feed(event)
    return replay.finish().events


def parse_only(data: bytes) -> int:
    return sum(1 for _ in read_values(io.BytesIO(data), decode=DECODER.decode))


def stdlib_only(data: bytes) -> int:
    text = data.decode()
    decoder = json.JSONDecoder()
    pos, n, end = 0, 0, len(text)
    while True:
        while pos < end and text[pos] in " \n\r\t":
            pos += 1
        if pos >= end:
            return n
        _, pos = decoder.raw_decode(text, pos)
        n += 1


def peak_memory(data: bytes) -> int:
    tracemalloc.start()
    run_replay(data)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def render_lean(scripts: list[SandboxScript]) -> bytes:
    return ("\n".join(json.dumps(e, indent=4) for e in recording(scripts)) + "\n").encode()


def measure(name: str, data: bytes, rounds: int, jobs: int, tmp: Path) -> dict[str, Any]:
    path = tmp / f"{name}.json"
    path.write_bytes(data)
    events = parse_only(data)
    t_stdlib = time_best(lambda: stdlib_only(data), 1)
    t_parse = time_best(lambda: parse_only(data), rounds)
    t_single = time_best(lambda: run_replay(path, 0), rounds)
    t_parallel = time_best(lambda: run_replay(path, jobs), rounds)
    return {
        "events": events,
        "bytes_per_event": round(len(data) / events),
        "megabytes": round(len(data) / 1e6, 1),
        "stdlib_parse_only_per_s": round(events / t_stdlib),
        "typed_parse_only_per_s": round(events / t_parse),
        "replay_in_process_per_s": round(events / t_single),
        f"replay_{jobs}_workers_per_s": round(events / t_parallel),
        "in_process_over_stdlib_parse": round(t_stdlib / t_single, 2),
        "workers_over_in_process": round(t_single / t_parallel, 2),
    }


ROOT = Path(__file__).resolve().parent.parent


def jsonl(scripts: list[SandboxScript]) -> bytes:
    """The recording as JSON Lines (`--output-watch-events -o json` piped through jq -c)."""
    return b"".join(
        json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in recording(scripts)
    )


def checkout(rev: str, into: Path) -> Path:
    """A worktree of `rev` (its controller sources), for the same interpreter to run."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(into), rev],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    return into / "controller" / "src"


def whole(src: Path, path: Path) -> float:
    """Seconds for `deathwatch replay PATH` as a process, with `src` as the package."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "deathwatch._cli", "replay", str(path)], env=env,
                   check=True, stdout=subprocess.DEVNULL, timeout=600)  # fmt: skip
    return time.perf_counter() - started


def main_whole(against: list[str], rounds: int, as_json: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        every = fleet(13900, 11)
        recordings = {
            "every fate": jsonl(every),
            "flapping exec probes": jsonl(fleet(2700, 5, flaps=8)),
            "every fate, kubectl's pretty layout": render_lean(every),
        }
        paths = {}
        for i, (name, data) in enumerate(recordings.items()):
            paths[name] = Path(tmp) / f"recording-{i}.jsonl"
            paths[name].write_bytes(data)
        sources = {"this checkout": ROOT / "controller" / "src"}
        for rev in against:
            sources[rev] = checkout(rev, Path(tmp) / f"rev-{rev}")
        try:
            results: dict[str, dict[str, Any]] = {}
            for name, path in paths.items():
                events = parse_only(recordings[name])
                best = {label: float("inf") for label in sources}
                for _ in range(rounds):
                    for label, src in sources.items():
                        best[label] = min(best[label], whole(src, path))
                results[name] = {
                    "events": events,
                    "megabytes": round(len(recordings[name]) / 1e6, 1),
                    **{f"{label} events/s": round(events / t) for label, t in best.items()},
                    **{f"{label} seconds": round(t, 2) for label, t in best.items()},
                }
        finally:
            for rev in against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(Path(tmp) / f"rev-{rev}")], check=False, timeout=60)  # fmt: skip
    if as_json:
        print(json.dumps(results, indent=2))
        return
    for name, r in results.items():
        print(
            f"{name}: {r['events']} events, {r['megabytes']} MB; whole process, best of {rounds}:"
        )
        for label in sources:
            print(
                f"  {label:<16} {r[f'{label} events/s']:>8,} events/s  ({r[f'{label} seconds']} s)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--whole", action="store_true", help="whole `deathwatch replay` processes")
    ap.add_argument("--against", action="append", default=[], metavar="REV",
                    help="with --whole: also measure this git revision (repeatable)")  # fmt: skip
    args = ap.parse_args()
    if args.whole:
        main_whole(args.against, args.rounds, args.json)
        return

    scripts = fleet(args.pods, 1)
    with tempfile.TemporaryDirectory() as tmp:
        lean = measure("lean", render_lean(scripts), args.rounds, args.jobs, Path(tmp))
        rich = measure("rich", render(scripts), args.rounds, args.jobs, Path(tmp))

    mem_pods = 1000
    few = render(fleet(mem_pods, 2, flaps=1))
    many = render(fleet(mem_pods, 2, flaps=8))
    double = render(fleet(2 * mem_pods, 2, flaps=1))
    m_few, m_many, m_double = peak_memory(few), peak_memory(many), peak_memory(double)
    memory = {
        "pods": mem_pods,
        "events_few": parse_only(few),
        "events_many": parse_only(many),
        "file_mb_few": round(len(few) / 1e6, 1),
        "file_mb_many": round(len(many) / 1e6, 1),
        "peak_mib_few_events": round(m_few / 2**20, 2),
        "peak_mib_many_events": round(m_many / 2**20, 2),
        "many_over_few": round(m_many / m_few, 3),
        "peak_mib_double_pods": round(m_double / 2**20, 2),
        "double_over_few": round(m_double / m_few, 3),
    }
    result = {"lean": lean, "rich": rich, "memory": memory, "cores": os.cpu_count()}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, r in (("lean (API-minimal pods)", lean), ("rich (env, volumes, tolerations)", rich)):
        print(
            f"{name}: {r['events']} events, {r['megabytes']} MB, {r['bytes_per_event']} bytes/event"
        )
        print(
            f"  stdlib json parse only     {r['stdlib_parse_only_per_s']:>8,} events/s  (baseline)"
        )
        print(f"  typed msgspec parse only   {r['typed_parse_only_per_s']:>8,} events/s")
        print(
            f"  replay, in-process         {r['replay_in_process_per_s']:>8,} events/s  = {r['in_process_over_stdlib_parse']} x baseline"
        )
        print(
            f"  replay, {args.jobs} workers          {r[f'replay_{args.jobs}_workers_per_s']:>8,} events/s  = {r['workers_over_in_process']} x in-process"
        )
    m = memory
    print(
        f"memory (tracemalloc peak), {m['pods']} pods: {m['peak_mib_few_events']} MiB for {m['events_few']} events "
        f"({m['file_mb_few']} MB), {m['peak_mib_many_events']} MiB for {m['events_many']} events "
        f"({m['file_mb_many']} MB) = x{m['many_over_few']}; {2 * m['pods']} pods: "
        f"{m['peak_mib_double_pods']} MiB = x{m['double_over_few']}"
    )


if __name__ == "__main__":
    main()
