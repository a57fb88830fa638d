"""Where the API server is and who we are to it: a kubeconfig, or the pod's ServiceAccount.

The kubernetes package's loader does the work (merging $KUBECONFIG's files, certificates,
tokens, credential plugins); this module reads the files first so that every way a
kubeconfig can be unusable is one line naming the file, the context and the field, never a
YAML traceback, a `TypeError` from a list where a mapping belongs, or a credential plugin's
failure logged on the root logger and then ignored (the loader does that: the request that
follows is then anonymous, and the API server says 401 or 403 about something else).

Two errors, for the two things a user fixes in different places:
- `KubeconfigError`: the file, a context, a cluster or a user as written;
- `CredentialError`: the credentials cannot be had (a credential plugin missing or failing).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes import client, config

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeconfigError(Exception):
    """The kubeconfig cannot be used as written (its message names the file and field)."""


class CredentialError(Exception):
    """The kubeconfig is fine, but its user's credentials cannot be had."""


@dataclass(frozen=True, slots=True)
class Loaded:
    configuration: client.Configuration
    namespace: str  # the context's, else the ServiceAccount's, else "default" (as kubectl)
    source: str  # for messages: "kubeconfig FILE, context NAME" or "in-cluster ServiceAccount"
    context: str | None  # None in-cluster
    user: str | None

    @property
    def server(self) -> str:
        return str(self.configuration.host)


def load(kubeconfig: str | None = None, context: str | None = None) -> Loaded:
    """--kubeconfig if given; else, in a pod (and with no --context), its ServiceAccount;
    else $KUBECONFIG's files (merged, the first to say a thing wins) or ~/.kube/config."""
    if not kubeconfig and not context and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return _in_cluster()
    files = _files(kubeconfig)
    merged = _merge([(path, _read(path)) for path in files])
    where = "kubeconfig " + ", ".join(str(p) for p in files)
    name = context or merged.current
    if not name:
        raise KubeconfigError(f"{where}: no current-context; pass --context ({_list(merged)})")
    ctx = merged.contexts.get(name)
    if ctx is None:
        raise KubeconfigError(f"{where}: no context {name!r} ({_list(merged)})")
    where = f"{where}, context {name!r}"
    cluster_name, user_name = _named(ctx, "cluster", where), _named(ctx, "user", where, True)
    cluster = merged.clusters.get(cluster_name)
    if cluster is None:
        raise KubeconfigError(f"{where}: its cluster {cluster_name!r} is not defined")
    if not isinstance(cluster.get("server"), str) or not cluster["server"]:
        raise KubeconfigError(f"{where}: cluster {cluster_name!r} has no server")
    user: Mapping[str, Any] = {}
    if user_name:
        if user_name not in merged.users:
            raise KubeconfigError(f"{where}: its user {user_name!r} is not defined")
        user = merged.users[user_name]
    plugin = _plugin(user, f"{where}, user {user_name!r}")
    configuration = client.Configuration()
    with _logged_failures() as failures:
        try:
            config.load_kube_config(
                config_file=os.pathsep.join(str(p) for p in files),
                context=name,
                client_configuration=configuration,
            )
        except (config.ConfigException, OSError, TypeError, ValueError, KeyError) as exc:
            raise KubeconfigError(f"{where}: {_said(exc)}") from exc
    if failures:
        # the loader logs a credential plugin's failure and goes on without credentials
        what = f"credential plugin {plugin!r}" if plugin else "credentials"
        raise CredentialError(f"{where}, user {user_name!r}: {what} failed: {failures[-1]}")
    namespace = ctx.get("namespace")
    return Loaded(
        configuration,
        namespace if isinstance(namespace, str) and namespace else "default",
        where,
        name,
        user_name or None,
    )


def _in_cluster() -> Loaded:
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        raise KubeconfigError(f"in-cluster ServiceAccount: {_said(exc)}") from exc
    try:
        namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip() or "default"
    except OSError:
        namespace = "default"
    return Loaded(configuration, namespace, "in-cluster ServiceAccount", None, None)


def _files(kubeconfig: str | None) -> list[Path]:
    if kubeconfig:
        return [Path(kubeconfig)]
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        # kubectl skips the files of $KUBECONFIG that do not exist, so long as one does
        present = [Path(p) for p in listed if Path(p).exists()]
        if not present:
            raise KubeconfigError(f"$KUBECONFIG: none of its files exists ({', '.join(listed)})")
        return present
    home = Path("~/.kube/config").expanduser()
    if not home.exists():
        raise KubeconfigError(
            f"no kubeconfig: {home} does not exist and $KUBECONFIG is not set (--kubeconfig FILE)"
        )
    return [home]


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path}: cannot read it: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise KubeconfigError(f"kubeconfig {path}: not text ({exc.reason})") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML{at}: {problem}") from exc
    if doc is None:
        raise KubeconfigError(f"kubeconfig {path}: empty")
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig ({_kind(doc)}, not a mapping)")
    return doc


@dataclass
class _Merged:
    current: str | None
    contexts: dict[str, Mapping[str, Any]]
    clusters: dict[str, Mapping[str, Any]]
    users: dict[str, Mapping[str, Any]]


def _merge(docs: list[tuple[Path, dict[str, Any]]]) -> _Merged:
    merged = _Merged(None, {}, {}, {})
    for path, doc in docs:
        current = doc.get("current-context")
        if merged.current is None and isinstance(current, str) and current:
            merged.current = current
        for key, into in (("contexts", merged.contexts), ("clusters", merged.clusters),
                          ("users", merged.users)):  # fmt: skip
            entries = doc.get(key) or []
            if not isinstance(entries, list):
                raise KubeconfigError(f"kubeconfig {path}: {key}: a list, not {_kind(entries)}")
            inner = key[:-1]
            for i, entry in enumerate(entries):
                name = entry.get("name") if isinstance(entry, dict) else None
                body = entry.get(inner) if isinstance(entry, dict) else None
                if not isinstance(name, str) or not name:
                    raise KubeconfigError(f"kubeconfig {path}: {key}[{i}]: no name")
                if body is None and inner == "user":
                    body = {}  # a user with nothing: anonymous, as kubectl allows
                if not isinstance(body, dict):
                    raise KubeconfigError(
                        f"kubeconfig {path}: {key}[{i}] ({name!r}): {inner}: a mapping, "
                        f"not {_kind(body)}"
                    )
                into.setdefault(name, body)
    return merged


def _named(ctx: Mapping[str, Any], key: str, where: str, optional: bool = False) -> str:
    value = ctx.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str) or not value:
        raise KubeconfigError(f"{where}: names no {key}")
    return value


def _plugin(user: Mapping[str, Any], where: str) -> str | None:
    """A credential plugin's command, checked to be there: the loader would only log it."""
    exec_ = user.get("exec")
    if not isinstance(exec_, dict):
        return None
    command = exec_.get("command")
    if not isinstance(command, str) or not command:
        raise KubeconfigError(f"{where}: exec has no command")
    if shutil.which(command) is None:
        raise CredentialError(f"{where}: credential plugin {command!r} not found (not on PATH)")
    return command


@contextmanager
def _logged_failures() -> Iterator[list[str]]:
    """What the loader logs as errors while it runs, kept rather than printed (it logs on the
    root logger, which would print `ERROR:root:` lines on a command's stderr)."""
    caught: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                caught.append(record.getMessage().strip().splitlines()[0][:300])

    root = logging.getLogger()
    handler = _Keep()
    root.addHandler(handler)  # a root handler also keeps logging.error() from basicConfig()
    try:
        yield caught
    finally:
        root.removeHandler(handler)


def _list(merged: _Merged) -> str:
    names = sorted(merged.contexts)
    return f"contexts: {', '.join(names)}" if names else "it defines no context"


def _kind(value: object) -> str:
    kinds: dict[type, str] = {list: "a list", str: "a string", dict: "a mapping"}
    return "nothing" if value is None else kinds.get(type(value), type(value).__name__)


def _said(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load_configuration(kubeconfig: str | None) -> client.Configuration:
    """--kubeconfig if given, else in a pod the ServiceAccount (its token re-read as it
    rotates), else $KUBECONFIG or ~/.kube/config. Raises `KubeconfigError` or
    `CredentialError`, each one line naming the file, context and field."""
    return load(kubeconfig).configuration
