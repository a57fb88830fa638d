"""Running nft: the only place that touches the kernel's tables (and only ours)."""

from __future__ import annotations

import json
import subprocess
from typing import Protocol

from deathwatch.firewall.table import FAMILY, NAME, Table, from_json, script

NFT_TIMEOUT = 10.0


class NftError(RuntimeError):
    pass


class Nft(Protocol):
    """The table, as the agent sees it: replaced whole, read back as the model."""

    @property
    def table_name(self) -> str:
        """The table's name: inet NAME, this release's own."""
        ...

    def apply(self, table: Table) -> None: ...

    def list_table(self) -> Table | None: ...

    def delete_table(self) -> None: ...


class SystemNft:
    """`nft` in the current network namespace, with a deadline on every call."""

    def __init__(self, binary: str = "nft", table: str = NAME) -> None:
        self.binary = binary
        self._table = table

    @property
    def table_name(self) -> str:
        return self._table

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [self.binary, *args],
                input=stdin,
                capture_output=True,
                text=True,
                timeout=NFT_TIMEOUT,
                check=False,
            )
        except FileNotFoundError:
            raise NftError(f"{self.binary} not found: install nftables") from None
        except subprocess.TimeoutExpired:
            raise NftError(
                f"{self.binary} {' '.join(args)} did not finish within {NFT_TIMEOUT:.0f}s"
            ) from None

    def apply(self, table: Table) -> None:
        if table.name != self._table:  # a bug: never another release's table
            raise NftError(f"refusing to write table {table.name}: this agent owns {self._table}")
        result = self._run(["-f", "-"], script(table))
        if result.returncode != 0:
            raise NftError(f"nft -f failed: {result.stderr.strip()}")

    def list_table(self) -> Table | None:
        result = self._run(["-j", "list", "table", FAMILY, self._table])
        if result.returncode != 0:
            if "No such file or directory" in result.stderr:
                return None
            raise NftError(f"nft list failed: {result.stderr.strip()}")
        try:
            return from_json(json.loads(result.stdout))
        except (ValueError, KeyError, TypeError) as exc:
            raise NftError(f"nft -j printed something we cannot read: {exc}") from None

    def delete_table(self) -> None:
        result = self._run(["delete", "table", FAMILY, self._table])
        if result.returncode != 0 and "No such file or directory" not in result.stderr:
            raise NftError(f"nft delete table failed: {result.stderr.strip()}")
