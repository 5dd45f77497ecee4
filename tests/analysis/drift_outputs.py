"""A small deterministic output, and its drifted form, shared by the HTTP and CLI tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

INTENTS = ("refund", "billing", "shipping", "cancel")
PRIORITIES = ("low", "medium", "high")
TIERS = ("gold", "silver", "bronze")


def output(i: int, drift: bool = False) -> dict[str, Any]:
    """A deterministic output; ``drift`` drops customer.tier from every second one and sends
    priority "URGENT" (never in the baseline) in every tenth."""
    out: dict[str, Any] = {"intent": INTENTS[i % 4], "priority": PRIORITIES[i % 3],
                           "customer": {"tier": TIERS[i % 3]}, "tags": ["billing"] * (i % 3)}
    if drift:
        if i % 2 == 0:
            del out["customer"]["tier"]
        if i % 10 == 0:
            out["priority"] = "URGENT"
    return out


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")
