"""How a command asks the API server, and says in one line why it could not (`deathwatch
wait`, `explain`, `preflight`): one exit code per thing the user fixes. Light to import: the
kubeconfig loader (the kubernetes package) is imported only when a command runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from deathwatch._api.kubeconfig import Loaded

# 3 the network (the address), 4 the kubeconfig (the file), 5 the credentials (the plugin, or
# a 401), 6 the API server's refusal (docs/adr/0022)
EXIT_UNREACHABLE, EXIT_KUBECONFIG, EXIT_CREDENTIALS, EXIT_REFUSED = 3, 4, 5, 6


def load(command: str, kubeconfig: str | None, context: str | None, err: TextIO) -> Loaded | int:
    """Where the API server is and who we are, or the exit code of why not (said)."""
    from deathwatch._api.kubeconfig import CredentialError, KubeconfigError
    from deathwatch._api.kubeconfig import load as load_kubeconfig

    try:
        return load_kubeconfig(kubeconfig, context)
    except KubeconfigError as exc:
        err.write(f"deathwatch {command}: {exc}\n")
        return EXIT_KUBECONFIG
    except CredentialError as exc:
        err.write(f"deathwatch {command}: {exc}\n")
        return EXIT_CREDENTIALS


def cannot_ask(
    command: str,
    exc: BaseException,
    loaded: Loaded,
    err: TextIO,
    *,
    forbidden: str = "",
    missing_resource: str = "",
) -> int:
    """One line for what the API server or the network did, and its exit code. `forbidden`
    and `missing_resource` say a 403 and a 404 for an unserved resource in the command's
    words."""
    from deathwatch._kube.errors import ApiError, NoAnswer

    say = f"deathwatch {command}:"
    at = f"the API server at {loaded.server} ({loaded.source})"
    if isinstance(exc, ApiError):
        if exc.unauthorized:
            err.write(f"{say} {at} does not accept these credentials (401): {exc.message}\n")
            return EXIT_CREDENTIALS
        if exc.missing_resource and missing_resource:
            err.write(f"{say} {at} {missing_resource}\n")
        elif exc.forbidden and forbidden:
            err.write(f"{say} {at} {forbidden} (403): {exc.message}\n")
        else:
            err.write(f"{say} {at} refused ({exc.status}): {exc.message}\n")
        return EXIT_REFUSED
    reason = exc.reason if isinstance(exc, NoAnswer) else (str(exc) or type(exc).__name__)
    err.write(f"{say} cannot reach {at}: {reason}\n")
    return EXIT_UNREACHABLE
