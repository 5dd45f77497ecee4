"""The baselines package's records (``BASELINES_SCHEMA``): frozen baseline documents and the
append-only history of which one each cohort is compared against, stored and read here as plain
rows; ``baselines/baseline.py`` builds, verifies and decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .core import StoreCore
from .schema import Schema

__all__ = ["BASELINES_SCHEMA", "BaselineRecords"]

BASELINES_SCHEMA = Schema(
    "baselines",
    (
        """
CREATE TABLE baselines (
    baseline_id VARCHAR PRIMARY KEY, hash VARCHAR NOT NULL UNIQUE,
    model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL,
    since TIMESTAMPTZ NOT NULL, until TIMESTAMPTZ NOT NULL, samples BIGINT NOT NULL,
    author VARCHAR NOT NULL, note VARCHAR NOT NULL, created_at TIMESTAMPTZ NOT NULL,
    document VARCHAR NOT NULL);
-- Append-only: the latest row of a cohort says what it is compared against.
CREATE SEQUENCE baseline_activation_seq START 1;
CREATE TABLE baseline_activations (
    seq BIGINT PRIMARY KEY DEFAULT nextval('baseline_activation_seq'),
    model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL,
    action VARCHAR NOT NULL, baseline_id VARCHAR, activated_at TIMESTAMPTZ NOT NULL,
    author VARCHAR NOT NULL, note VARCHAR NOT NULL);
""",
        # The source is part of the cohort (schema.py, version 10): baselines and activations
        # stored before are production's.
        """
ALTER TABLE baselines ADD COLUMN source VARCHAR DEFAULT 'production';
ALTER TABLE baseline_activations ADD COLUMN source VARCHAR DEFAULT 'production';
""",
    ),
)

_COHORT = "model = ? AND prompt_version = ? AND contract = ? AND source = ?"
_BASELINE = "baseline_id, hash, model, prompt_version, contract, since, until, samples, author, note, created_at, document, source"
_ACTIVATION = "model, prompt_version, contract, action, baseline_id, activated_at, author, note, source"


def _params(cohort: Sequence[str]) -> list[str]:
    """(model, prompt version, contract[, source]) as query parameters; no source: production."""
    return [*cohort[:3], cohort[3] if len(cohort) > 3 else "production"]


class BaselineRecords(StoreCore):
    """Rows of the baseline tables; a cohort is (model, prompt version, contract, source)."""

    def add_baseline(self, con: Any, row: Sequence[Any]) -> bool:
        """Store a baseline unless its id is stored, in the transaction ``con``: (baseline_id, hash,
        model, prompt_version, contract, since, until, samples, author, note, created_at, document, source).
        True when it was new."""
        return bool(
            con.execute(
                f"""INSERT INTO baselines ({_BASELINE}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT DO NOTHING RETURNING baseline_id""",
                list(row),
            ).fetchall()
        )

    def baseline_documents(self, id_prefix: str, limit: int = 2) -> list[str]:
        """The documents of up to ``limit`` baselines whose id starts with ``id_prefix``."""
        return [
            str(r[0])
            for r in self.query(
                "SELECT document FROM baselines WHERE starts_with(baseline_id, ?) LIMIT ?", [id_prefix, limit]
            )
        ]

    def baseline_document_list(self, cohort: Sequence[str] | None = None) -> list[str]:
        """The documents of every baseline (of one cohort), the newest first."""
        where, params = (f"WHERE {_COHORT}", _params(cohort)) if cohort else ("", [])
        return [
            str(r[0])
            for r in self.query(f"SELECT document FROM baselines {where} ORDER BY created_at DESC, baseline_id", params)
        ]

    def add_baseline_activation(self, con: Any, row: Sequence[Any]) -> None:
        """Append (model, prompt_version, contract, action, baseline_id, activated_at, author, note,
        source), in the transaction ``con``."""
        con.execute(f"INSERT INTO baseline_activations ({_ACTIVATION}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", list(row))

    def baseline_activations(self, cohort: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
        """Activation rows (as ``add_baseline_activation`` takes them), of one cohort or all, oldest first."""
        where, params = (f"WHERE {_COHORT}", _params(cohort)) if cohort else ("", [])
        return self.query(f"SELECT {_ACTIVATION} FROM baseline_activations {where} ORDER BY seq", params)
