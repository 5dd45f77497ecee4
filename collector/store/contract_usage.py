"""How each contract version is used: checked outputs per version, status and time step, read
from ``contract_rollups`` (the Contracts page's violation rates per version over time, and which
cohorts send which version)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from .core import StoreCore

__all__ = ["ContractUsage"]


class ContractUsage(StoreCore):
    """Reads of contract checks by version over time."""

    def contract_status_steps(
        self, cohort_ids: Sequence[int], since: datetime, until: datetime, step_seconds: float
    ) -> list[tuple[int, str, int, str, int]]:
        """(cohort id, contract version ('' untagged), step, status, outputs) over ``[since, until)``
        cut in steps of ``step_seconds`` from ``since`` (a bucket counts in the step it starts in),
        for the cohorts given; by cohort, version, step and status."""
        if not cohort_ids or step_seconds <= 0:
            return []
        return [
            (int(c), str(v), int(step), str(status), int(n))
            for c, v, step, status, n in self.query(
                """SELECT cohort_id, contract_version,
                          floor((epoch(bucket) - epoch($since::TIMESTAMPTZ)) / $step)::BIGINT AS step,
                          status, sum(n)::BIGINT
                   FROM contract_rollups
                   WHERE bucket >= $since AND bucket < $until AND list_contains($ids, cohort_id)
                   GROUP BY ALL ORDER BY ALL""",
                {"since": since, "until": until, "step": float(step_seconds), "ids": [int(i) for i in cohort_ids]},
            )
        ]
