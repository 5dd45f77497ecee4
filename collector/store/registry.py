"""Registered contract versions (``contract_versions``): stored and read here, validated and
fingerprinted by ``collector/contracts.py``, which reaches the store only through these methods."""

from __future__ import annotations

from typing import Any

from ..contracts import ContractRow
from .maintenance import Maintenance

__all__ = ["ContractVersions"]


_COLUMNS = (
    "contract, version, document, content_hash, catalog, tools, invocation_hash, discovery_hash, registered_at, "
    "author, note"
)


def _row(r: tuple[Any, ...]) -> ContractRow:
    return ContractRow(*r)


class ContractVersions(Maintenance):
    """Contract versions: inserted once, never changed."""

    def add_contract_version(self, row: ContractRow) -> str | None:
        """Store ``row`` unless its (contract, version) is registered; returns the content hash
        registered before (None when ``row`` was stored). The caller tells a repeat (the same
        hash) from a conflict: the stored row is never changed."""
        with self.transaction(f"registering contract {row.contract!r} version {row.version!r}") as con:
            found = con.execute(
                "SELECT content_hash FROM contract_versions WHERE contract = ? AND version = ?",
                [row.contract, row.version],
            ).fetchone()
            if found is not None:
                return str(found[0])
            con.execute(f"INSERT INTO contract_versions ({_COLUMNS}) VALUES ({', '.join('?' * len(row))})", list(row))
        return None

    def contract_version(self, contract: str, version: str) -> ContractRow | None:
        """The stored row of a contract version, or None."""
        rows = self.query(
            f"SELECT {_COLUMNS} FROM contract_versions WHERE contract = ? AND version = ?", [contract, version]
        )
        return _row(rows[0]) if rows else None

    def contract_versions(self, contract: str | None = None) -> list[ContractRow]:
        """Every registered version (of one contract), by contract, oldest registration first."""
        return [
            _row(r)
            for r in self.query(
                f"SELECT {_COLUMNS} FROM contract_versions WHERE ? IS NULL OR contract = ? "
                "ORDER BY contract, registered_at, version",
                [contract, contract],
            )
        ]
