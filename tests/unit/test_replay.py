"""`deathwatch replay`: recordings with expected reports, the CLI's contract, bad input."""

from __future__ import annotations

import io
import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deathwatch._cli import main
from deathwatch._replay.stream import StreamError, read_values
from tests.examples import examples

DATA = Path(__file__).parents[1] / "data"
SAMPLE = Path(__file__).parents[1] / "data" / "sample-watch.json"


def replay(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deathwatch._cli", "replay", *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def replay_json(*args: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["replay", *args, "--format", "json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize(
    "name", ["no-probe-morning.json", "exec-probe-flaps.jsonl", "with-junk.json"]
)
def test_recordings_give_their_expected_reports(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = json.loads((DATA / (name.rsplit(".", 1)[0] + ".expected.json")).read_text())
    assert replay_json(str(DATA / name), "--agent-port", "49983", capsys=capsys) == expected


def test_no_probe_morning_in_detail(capsys: pytest.CaptureFixture[str]) -> None:
    report = replay_json(str(DATA / "no-probe-morning.json"), capsys=capsys)
    dead = {d["name"]: (d["cause"], d["exit_code"]) for d in report["dead"]}
    assert dead == {
        "exit-3": ("ContainerExited", 3),
        "oom": ("OOMKilled", 137),
        "evicted": ("Evicted", 137),
        "restarted": ("ContainerExited", 2),
        "node-lost": ("NodeLost", None),
    }
    # deleted and completed sandboxes are not deaths
    assert report["verdicts"] == {"Alive": 2, "Dead": 5, "Gone": 2}
    assert (report["sandboxes"], report["false_positives"], report["flaps"]) == (9, 0, 0)


def test_exec_flaps_are_counted_and_the_hang_dies_at_the_window(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = replay_json(str(DATA / "exec-probe-flaps.jsonl"), capsys=capsys)
    assert report["flaps"] == 4  # 1 + 3
    [hang] = report["dead"]
    assert (hang["name"], hang["cause"]) == ("hang", "Unresponsive")
    assert (hang["ready_drop_at"], hang["declared_at"]) == (
        "2026-11-29T10:02:01Z",
        "2026-11-29T10:03:03Z",
    )


def test_pods_whose_probe_the_firewall_refuses_are_listed_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [str(DATA / "exec-probe-flaps.jsonl"), "--agent-port", "49983"]
    assert main(["replay", *args]) == 0
    text = capsys.readouterr().out
    assert "1 pod(s) have a network readiness probe on an agent port" in text
    assert "\n  sandboxes/tcp-blocked\n" in text
    assert replay_json(*args, capsys=capsys)["probe_blocked_pods"] == ["sandboxes/tcp-blocked"]


def test_no_probe_policy_on_flapping_pods_turns_every_first_flap_into_a_death(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = replay_json(
        str(DATA / "exec-probe-flaps.jsonl"), "--policy", "no-probe", capsys=capsys
    )
    assert {d["name"] for d in report["dead"]} == {"flap-once", "flap-thrice", "hang"}
    # recoveries after those verdicts are false positives, once per pod
    assert report["false_positives"] == 2
    assert report["policies"] == {"no-probe": 4}


def test_window_multiplier_changes_the_hang_verdict_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = replay_json(
        str(DATA / "exec-probe-flaps.jsonl"), "--exec-window-multiplier", "1", capsys=capsys
    )
    [hang] = report["dead"]
    assert hang["declared_at"] == "2026-11-29T10:02:32Z"  # drop + 31 s


def test_pretty_and_json_lines_give_the_same_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "morning.jsonl"
    with lines.open("w") as out:
        for raw in read_values((DATA / "no-probe-morning.json").open("rb")):
            out.write(json.dumps(raw.value) + "\n")
    a = replay_json(str(DATA / "no-probe-morning.json"), capsys=capsys)
    b = replay_json(str(lines), capsys=capsys)
    assert a == b


def test_stdin_and_selector(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = (DATA / "no-probe-morning.json").read_bytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    everything = replay_json("-", capsys=capsys)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    nothing = replay_json("-", "--selector", "app=other", capsys=capsys)
    assert everything["sandboxes"] == 9
    assert (nothing["sandboxes"], nothing["dead"]) == (0, [])


def test_table_output_for_people() -> None:
    result = replay(str(SAMPLE))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "POLICY" in out
    assert "no-probe" in out
    assert "Detection delay" in out
    assert "Death causes:" in out


def test_skipped_objects_are_reported_not_fatal() -> None:
    result = replay(str(DATA / "with-junk.json"), "--format", "json")
    assert result.returncode == 0
    report = json.loads(result.stdout)
    assert report["skipped"]["count"] == 5
    assert report["skipped"]["by_reason"]["metadata.creationTimestamp"] == 1
    assert "skipped 5 object(s)" in result.stderr


# --- bad input: a clear message, exit 2, nothing printed as if complete -------------------


def test_truncated_input_names_event_and_offset(tmp_path: Path) -> None:
    data = (DATA / "no-probe-morning.json").read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    result = replay(str(cut))
    assert result.returncode == 2
    assert result.stdout == ""
    assert "truncated input" in result.stderr
    assert "event #" in result.stderr
    assert "byte offset" in result.stderr
    assert "Traceback" not in result.stderr


def test_malformed_json_in_the_middle(tmp_path: Path) -> None:
    events = [json.dumps({"type": "ADDED", "object": {"kind": "Pod"}}) for _ in range(3)]
    bad = tmp_path / "bad.jsonl"
    text = (
        events[0]
        + "\n"
        + events[1]
        + "\n"
        + '{"type": "ADDED", "object": {"kind": "Pod",, }}\n'
        + events[2]
        + "\n"
    )
    bad.write_text(text)
    result = replay(str(bad))
    assert result.returncode == 2
    assert result.stdout == ""
    offset = len(events[0]) + len(events[1]) + 2 + text.split("\n")[2].index(",,") + 1
    assert f"event #3 at byte offset {offset}: malformed JSON" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "policy 'nope' is not known"),
        (["--selector", "app in (a,b)"], "set-based terms are not supported"),
        (["--selector", "bad key=x"], "invalid label key"),
        (["--exec-window-multiplier", "-1"], "must be a positive finite number"),
        (["--agent-port", "70000"], "not a TCP port"),
        (["--format", "yaml"], "invalid choice"),
    ],
)
def test_bad_options_exit_2_with_a_clear_message(args: list[str], message: str) -> None:
    result = replay(str(DATA / "no-probe-morning.json"), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


def test_missing_file() -> None:
    result = replay("/nonexistent/recording.json")
    assert (result.returncode, result.stdout) == (2, "")
    assert "cannot read /nonexistent/recording.json: No such file or directory" in result.stderr


def test_invalid_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"kind": "Pod", "metadata": {"name": "\xff\xfe"}}\n')
    result = replay(str(bad))
    assert result.returncode == 2
    assert "event #1 at byte offset" in result.stderr


# --- third-party policies through entry points --------------------------------------------


def test_a_plugin_policy_is_installed_and_selected(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "lenient_policy").mkdir(parents=True)
    (site / "lenient_policy" / "__init__.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            from deathwatch.policy import Decision, State

            @dataclass(frozen=True)
            class NeverDies:  # written to the contract before window() left it: still loads
                name: str = "never-dies"
                def applies(self, pod, settings): return True
                def window(self, pod, settings): return None
                def judge(self, situation): return Decision(State.ALIVE)
            """
        )
    )
    dist = site / "lenient_policy-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lenient-policy\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[deathwatch.policies]\nnever-dies = lenient_policy:NeverDies\n"
    )
    env_path = f"{site}:{Path(__file__).parents[2]}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deathwatch._cli",
            "replay",
            str(DATA / "no-probe-morning.json"),
            "--policy",
            "never-dies",
            "--format",
            "json",
        ],
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["policies"] == {"never-dies": 9}
    # its judgement is used where policies judge (a restart, a lost node: alive to it);
    # lifecycle facts (phase Failed, eviction) still stand
    assert {d["name"] for d in report["dead"]} == {"exit-3", "oom", "evicted"}
    # auto selection never picks a plugin
    auto = subprocess.run(
        [
            sys.executable,
            "-m",
            "deathwatch._cli",
            "replay",
            str(DATA / "no-probe-morning.json"),
            "--format",
            "json",
        ],
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "never-dies" not in json.loads(auto.stdout)["policies"]


# --- the stream reader --------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=12,
)


@examples(300)
@given(
    st.lists(st.dictionaries(st.text(max_size=6), json_values, max_size=4), max_size=6),
    st.sampled_from(["pretty", "lines", "compact-pretty"]),
    st.integers(1, 64),
)
def test_reader_is_independent_of_layout_and_chunking(
    values: list[dict[str, Any]], layout: str, chunk: int
) -> None:
    if layout == "pretty":
        text = "".join(json.dumps(v, indent=4) + "\n" for v in values)
    elif layout == "lines":
        text = "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in values)
    else:
        text = "".join(json.dumps(v, indent=1, ensure_ascii=False) for v in values)
    data = text.encode()
    got = [r.value for r in read_values(io.BytesIO(data), chunk_size=chunk)]
    assert got == values
    # each offset is where its value starts
    assert all(
        data[r.offset : r.offset + 1] == b"{"
        for r in read_values(io.BytesIO(data), chunk_size=chunk)
    )


@examples(300)
@given(st.binary(max_size=200), st.integers(1, 32))
def test_reader_on_garbage_raises_only_stream_error(data: bytes, chunk: int) -> None:
    error: StreamError | None = None
    try:
        for _ in read_values(io.BytesIO(data), chunk_size=chunk):
            pass
    except StreamError as exc:
        error = exc
    if error is not None:
        assert 0 <= error.offset <= len(data)
        assert error.index >= 1


# --- worker processes give the same answers ---------------------------------------------


@pytest.mark.parametrize(
    "name", ["no-probe-morning.json", "exec-probe-flaps.jsonl", "with-junk.json"]
)
def test_workers_give_the_same_report(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deathwatch._replay import parallel

    monkeypatch.setattr(parallel, "PIECE_SIZE", 4096)  # many pieces even for small files
    in_process = replay_json(str(DATA / name), "--jobs", "0", capsys=capsys)
    for jobs in ("1", "2", "3"):
        assert replay_json(str(DATA / name), "--jobs", jobs, capsys=capsys) == in_process


@pytest.mark.parametrize("cut", [0.3, 0.5, 0.97])
def test_workers_report_the_same_error_position(
    tmp_path: Path, cut: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = (DATA / "no-probe-morning.json").read_bytes()
    broken = tmp_path / "broken.json"
    # corrupt one byte in the middle of a value, keep the rest
    at = int(len(data) * cut)
    at = data.index(b'"', at)
    broken.write_bytes(data[:at] + b"!" + data[at + 1 :])
    one = replay(str(broken), "--jobs", "0")
    many = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, deathwatch._replay.parallel as p; p.PIECE_SIZE = 2048; from deathwatch._cli import main; sys.exit(main(sys.argv[1:]))",
            "replay",
            str(broken),
            "--jobs",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert one.returncode == many.returncode == 2
    assert one.stderr == many.stderr
    assert "malformed JSON" in one.stderr


def test_pieces_end_between_values() -> None:
    from deathwatch._replay.parallel import pieces

    data = (DATA / "no-probe-morning.json").read_bytes()
    spans = pieces(data, 1000)
    assert spans[0][0] == 0
    assert spans[-1][1] == len(data)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end == start
        assert data[end - 2 : end + 1] == b"}\n{"


def test_html_is_one_self_contained_page_of_plots(capsys: pytest.CaptureFixture[str]) -> None:
    """`--format html`: every plot an inline SVG made by matplotlib; no script and nothing
    fetched from anywhere; each section there, the dead named, the policies side by side."""
    assert main(["replay", str(DATA / "disruptions.json"), "--format", "html"]) == 0
    page = capsys.readouterr().out
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    for heading in ("Pods over time", "Each policy on this recording", "Detection delay",
                    "Deaths per cause", "Deaths per node", "Deaths"):  # fmt: skip
        assert f"<h2>{heading}</h2>" in page, heading
    assert page.count("<svg") == 5 and "Matplotlib" in page  # made by the library
    assert "<script" not in page and "src=" not in page and "<link" not in page
    assert "disrupted/drained-0" in page and "Drained" in page and "node-drain" in page
    for policy in ("no-probe", "exec-probe", "container-state"):
        assert f"<tr><td>{policy}</td><td>14</td><td>10</td>" in page, policy


def test_html_without_matplotlib_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['matplotlib'] = None; "
         "from deathwatch._cli import main; sys.exit(main(sys.argv[1:]))",
         "replay", str(DATA / "disruptions.json"), "--format", "html"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "deathwatch replay: --format html needs matplotlib: pip install 'deathwatch[report]'\n"
    )


def test_a_recording_with_node_exits_is_judged_as_the_controller_judges_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ADR 0028: a NODE_EXIT record (the exit, and the pod as read at it) is Dead at once,
    observed by the node; one of an instance the pod does not name, or without its pod, is
    not a death (the latter skipped, said)."""
    from tests.builders import pod, running, terminated

    cid = "containerd://" + "c" * 64
    live = pod(containers=[running(cid=cid)])
    report = pod(ready=False, ready_at=51, containers=[terminated(code=7, finished=50, cid=cid)])
    exit_ = {"id": cid, "code": 7, "at": "2026-11-29T10:00:50.250000Z", "node": "n1"}
    other = {**exit_, "id": "containerd://" + "d" * 64}
    lines = [
        {"type": "ADDED", "object": live},
        {"type": "NODE_EXIT", "exit": other, "object": live},  # not its instance
        {"type": "NODE_EXIT", "exit": exit_},  # no pod as read: skipped
        {"type": "NODE_EXIT", "exit": exit_, "object": live},
        {"type": "MODIFIED", "object": report},
    ]
    path = tmp_path / "heard.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = replay_json(str(path), capsys=capsys)
    (dead,) = out["dead"]
    assert (dead["cause"], dead["exit_code"], dead["observed_by"]) == ("ContainerExited", 7, "node")
    assert dead["ready_drop_at"] == "2026-11-29T10:00:50.250000Z"
    assert out["skipped"]["count"] == 1 and "NODE_EXIT" in out["skipped"]["examples"][0]
    assert out["false_positives"] == 0
