"""A small deterministic output, and its drifted form, shared by the HTTP, CLI, pager and
reliability tests."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

INTENTS = ("refund", "billing", "shipping", "cancel")
PRIORITIES = ("low", "medium", "high")
TIERS = ("gold", "silver", "bronze")


def output(i: int, drift: bool = False, *, urgent_every: int = 10) -> dict[str, Any]:
    """A deterministic output; ``drift`` drops customer.tier from every second one (a presence
    drop, page) and sends priority "URGENT" (never in the baseline) in every ``urgent_every``-th
    (every 4th: a quarter unknown, unknown_enum_growth above its page level)."""
    out: dict[str, Any] = {
        "intent": INTENTS[i % 4],
        "priority": PRIORITIES[i % 3],
        "customer": {"tier": TIERS[i % 3]},
        "tags": ["billing"] * (i % 3),
    }
    if drift:
        if i % 2 == 0:
            del out["customer"]["tier"]
        if i % urgent_every == 0:
            out["priority"] = "URGENT"
    return out


def envelopes(
    start: datetime,
    n: int,
    step: timedelta,
    *,
    model: str,
    prompt_version: str,
    contract: str,
    drift: bool = False,
    urgent_every: int = 10,
) -> list[dict[str, Any]]:
    """``n`` envelopes of ``output`` from ``start``, ``step`` apart, each with a fresh event id."""
    return [
        {
            "event_id": uuid.uuid4().hex,
            "ts": iso(start + i * step),
            "model": model,
            "served_model": model,
            "prompt_version": prompt_version,
            "contract": contract,
            "output": output(i, drift, urgent_every=urgent_every),
        }
        for i in range(n)
    ]


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")
