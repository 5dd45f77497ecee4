"""Opening the store from settings: the one place that maps Settings onto Store.open."""

from __future__ import annotations

from shapewatch.collector import RollupConfig, Settings, Store
from shapewatch.collector.store import ALERTS_SCHEMA, BASELINES_SCHEMA, NOTIFY_SCHEMA, PROBES_SCHEMA, RUNS_SCHEMA

__all__ = ["SCHEMAS", "open_store"]

# The tables of the packages above the collector (their DDL and SQL live in the store package),
# migrated with the store's own.
SCHEMAS = (BASELINES_SCHEMA, ALERTS_SCHEMA, NOTIFY_SCHEMA, RUNS_SCHEMA, PROBES_SCHEMA)


def open_store(settings: Settings, *, read_only: bool = False, bulk: bool = False) -> Store:
    """The store for the service, or with ``bulk`` for an import (a smaller memory limit)."""
    return Store.open(
        settings.db_path,
        memory_limit=settings.import_memory_limit if bulk else settings.memory_limit,
        threads=settings.duckdb_threads,
        checkpoint_threshold=settings.checkpoint_threshold,
        bucket_seconds=settings.bucket_seconds,
        read_only=read_only,
        schemas=SCHEMAS,
        tiers=settings.tiers,
        rollup=RollupConfig(
            enum_value_max_length=settings.enum_value_max_length,
            enum_values_per_path=settings.enum_values_per_path,
            free_text_min_distinct=settings.free_text_min_distinct,
            redact_paths=settings.redact_paths,
            max_depth=settings.max_depth,
            contract_checks_per_bucket=settings.contract_checks_per_bucket,
            contract_check_ms=settings.contract_check_ms,
            contract_check_budget_ms=settings.contract_check_budget_ms,
        ),
    )
