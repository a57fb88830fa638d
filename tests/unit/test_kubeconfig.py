"""Every way a kubeconfig, a credential or a connection can fail `deathwatch wait|explain`: one
line naming the file, context or address, a distinct exit code, never a traceback. The
API server's own refusals (401, 403, 404s) are judged on a real one in tests/chaos/test_client.py.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from deathwatch._api.kubeconfig import CredentialError, KubeconfigError, load
from deathwatch._cli import main

GOOD = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server}"}}
users:
- name: u
  user: {user}
contexts:
- name: x
  context: {{cluster: c, user: u, namespace: team-a}}
- name: y
  context: {{cluster: c, user: u}}
current-context: x
"""


def kubeconfig(tmp_path: Path, server: str = "https://127.0.0.1:1", user: str = "{token: t}",
               name: str = "kc") -> Path:  # fmt: skip
    path = tmp_path / name
    path.write_text(GOOD.format(server=server, user=user))
    return path


def plugin(tmp_path: Path, script: str) -> str:
    path = tmp_path / "plugin"
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture(autouse=True)
def outside_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("apiVersion: v1\nclusters: [\n  - bad\n", "not valid YAML at line 3, column 3"),
        ("- a\n- b\n", "not a kubeconfig (a list, not a mapping)"),
        ("just words\n", "not a kubeconfig (a string, not a mapping)"),
        ("", "empty"),
        ("contexts: {x: 1}\n", "contexts: a list, not a mapping"),
        ("contexts:\n- context: {cluster: c}\n", "contexts[0]: no name"),
        ("contexts:\n- name: x\n  context: [1]\n", "contexts[0] ('x'): context: a mapping, not a list"),
        ("contexts: []\n", "no current-context; pass --context (it defines no context)"),
        ("current-context: z\ncontexts:\n- name: x\n  context: {cluster: c}\n",
         "no context 'z' (contexts: x)"),
        ("current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\n",
         "context 'x': its cluster 'c' is not defined"),
        ("current-context: x\ncontexts:\n- name: x\n  context: {user: u}\n",
         "context 'x': names no cluster"),
        ("current-context: x\nclusters:\n- name: c\n  cluster: {}\ncontexts:\n- name: x\n"
         "  context: {cluster: c}\n", "context 'x': cluster 'c' has no server"),
        ("current-context: x\nclusters:\n- name: c\n  cluster: {server: 'https://h'}\n"
         "contexts:\n- name: x\n  context: {cluster: c, user: v}\n",
         "context 'x': its user 'v' is not defined"),
        ("current-context: x\nclusters:\n- name: c\n  cluster: {server: 'https://h', "
         "certificate-authority: /nonexistent/ca.crt}\ncontexts:\n- name: x\n"
         "  context: {cluster: c}\n", "context 'x': "),
    ],
)  # fmt: skip
def test_an_unusable_kubeconfig_is_one_line_naming_the_file_and_field(
    tmp_path: Path, text: str, said: str
) -> None:
    path = tmp_path / "kc"
    path.write_text(text)
    with pytest.raises(KubeconfigError) as caught:
        load(str(path))
    message = str(caught.value)
    assert message.startswith(f"kubeconfig {path}"), message
    assert said in message and "\n" not in message, message


def test_a_missing_file_or_none_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KubeconfigError, match=r"kc-nope: cannot read it: No such file"):
        load(str(tmp_path / "kc-nope"))
    with pytest.raises(KubeconfigError, match=r"home/.kube/config does not exist and \$KUBE"):
        load()
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))
    with pytest.raises(KubeconfigError, match=r"\$KUBECONFIG: none of its files exists"):
        load()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    with pytest.raises(KubeconfigError, match=r"^in-cluster ServiceAccount: "):
        load()


def test_kubeconfig_files_merge_and_the_context_gives_the_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = tmp_path / "first"
    first.write_text("current-context: y\n")  # says which context; the other file defines it
    second = kubeconfig(tmp_path, server="https://10.1.2.3:6443")
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "absent"), str(first),
                                                      str(second)]))  # fmt: skip
    loaded = load()
    assert (loaded.context, loaded.namespace, loaded.server) == (
        "y",
        "default",
        "https://10.1.2.3:6443",
    )
    assert load(context="x").namespace == "team-a"
    assert loaded.source == f"kubeconfig {first}, {second}, context 'y'"


def test_a_credential_plugin_missing_or_failing_is_said_not_logged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handlers = list(logging.getLogger().handlers)
    exec_ = "{{exec: {{apiVersion: client.authentication.k8s.io/v1, command: {}}}}}"
    absent = kubeconfig(tmp_path, user=exec_.format("no-such-plugin"))
    with pytest.raises(
        CredentialError, match="user 'u': credential plugin 'no-such-plugin' not fo"
    ):
        load(str(absent))
    failing = kubeconfig(tmp_path, user=exec_.format(plugin(tmp_path, "echo denied >&2; exit 1")))
    with pytest.raises(
        CredentialError, match=r"context 'x', user 'u': credential plugin .* failed"
    ):
        load(str(failing))
    # the kubernetes loader logs the failure on the root logger (and would basicConfig() it)
    assert capsys.readouterr().err == ""
    assert logging.getLogger().handlers == handlers


@pytest.fixture(autouse=True)
def structlog_as_it_was() -> Iterator[None]:
    """The commands point structlog at their stderr (here, capsys's): put it back after."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return code, err.strip()


@pytest.mark.parametrize("command", [["wait", "--for", "dead", "--timeout", "5s"], ["explain"]])
def test_each_failure_has_its_exit_code_and_names_what_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    bad = tmp_path / "bad"
    bad.write_text("- a\n")
    code, said = cli(capsys, *command, "ns/p", "--kubeconfig", str(bad))
    assert code == 4 and f"kubeconfig {bad}: not a kubeconfig" in said
    code, said = cli(capsys, *command, "ns/p", "--kubeconfig", str(kubeconfig(tmp_path)),
                     "--context", "z")  # fmt: skip
    assert code == 4 and "no context 'z' (contexts: x, y)" in said
    exec_ = "{exec: {apiVersion: client.authentication.k8s.io/v1, command: gone-plugin}}"
    code, said = cli(
        capsys, *command, "ns/p", "--kubeconfig", str(kubeconfig(tmp_path, user=exec_))
    )
    assert code == 5 and "credential plugin 'gone-plugin' not found" in said
    # nothing listens on port 1: the address and the kubeconfig's context, not a repr
    code, said = cli(capsys, *command, "p", "--kubeconfig", str(kubeconfig(tmp_path)))
    assert code == 3, said
    assert said.startswith(f"deathwatch {command[0]}: cannot reach the API server at "
                           f"https://127.0.0.1:1 (kubeconfig {tmp_path}/kc, context 'x'): ")  # fmt: skip
    assert "ConnectionKey" not in said and "Error(" not in said, said
    # a bad name is bad input whatever the kubeconfig
    code, said = cli(capsys, *command, "ns/Not_A_Name", "--kubeconfig", str(bad))
    assert code == 2 and "'Not_A_Name' is not a Kubernetes name" in said


def test_the_controller_says_an_unusable_kubeconfig_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("clusters: [\n")
    done = subprocess.run(
        [sys.executable, "-m", "deathwatch._cli", "controller", "--kubeconfig", str(bad)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "KUBERNETES_SERVICE_HOST": ""},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"deathwatch controller: kubeconfig {bad}: not valid YAML")
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (
            "pod:only-a-namespace",
            "--shard-epoch: 'pod:only-a-namespace': expected pod:NAMESPACE/NAME",
        ),
        ("soon", "--shard-epoch: 'soon': expected a number, or pod:NAMESPACE/NAME"),
        ("-1", "--shard-epoch: shard epoch -1: expected a number >= 0"),
    ],
)
def test_a_bad_shard_epoch_is_one_line_naming_the_flag(value: str, said: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "deathwatch._cli", "controller", "--shards=2", "--shard=0",
         f"--shard-epoch={value}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"deathwatch controller: --shards/--shard/{said}\n", done.stderr


def test_the_shard_epoch_is_a_number_or_a_pod_read_at_start() -> None:
    from deathwatch._operator.process.config import shard_epoch

    assert shard_epoch("7") == (7, None)
    assert shard_epoch("pod:deathwatch-system/deathwatch-controller-0") == (
        0, ("deathwatch-system", "deathwatch-controller-0"),
    )  # fmt: skip
