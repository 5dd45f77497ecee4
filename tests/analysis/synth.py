"""Synthetic cohorts for analyzer tests: realistic structured outputs with a drift knob per scenario.

``synth_output(rnd, drift)`` returns one output of a support-ticket triage prompt
(25 field paths: enums, optional and nullable fields, nested objects, arrays of
objects and of strings, a number field mixing whole numbers and fractions, free
text). ``Drift()`` is the baseline's own distribution; each knob moves one thing.
Distributions are chosen away from the edges the rules judge (no enum value so
rare it may be missing from a baseline, no array-length CDF near 0.5 or 0.9), so
that a window of the same distribution is judged unchanged.

``write_cohort`` stores n outputs through the real ingest path (envelope parse,
``Store.write_batch``) spread over one time span, and returns them so that tests
can compute the expected statistics from the raw outputs (``path_stats``), apart
from the rollups the analyzer reads.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from harness import make_envelope

from shapewatch.collector import FieldProfile, Store
from shapewatch.collector.envelope import LIMITS, parse_envelope
from shapewatch.collector.flatten import json_type_of

MODEL = "claude-sonnet-4-5-20250929"
PROMPT = "intake-v3"
CONTRACT = "intake"

INTENT = {"refund": 0.30, "billing": 0.25, "shipping": 0.20, "cancel": 0.15, "other": 0.10}
PRIORITY = {"low": 0.45, "medium": 0.35, "high": 0.20}
SENTIMENT = {"positive": 0.25, "neutral": 0.45, "negative": 0.30}
LANGUAGE = {"en": 0.60, "de": 0.15, "fr": 0.15, "es": 0.10}
TIER = {"bronze": 0.50, "silver": 0.30, "gold": 0.20}
ENTITY_TYPE = {"order": 0.40, "product": 0.30, "date": 0.20, "amount": 0.10}
CHANNEL = {"email": 0.50, "phone": 0.30, "chat": 0.20}
TAGS = ("billing", "delivery", "refund", "account", "bug", "feedback")
# Lengths with CDFs 0.08, 0.35, 0.70, 0.88, 1.0 (p50 = 2, p90 = 4) and 0.12, 0.57, 0.82, 1.0.
ENTITY_LENGTHS = {0: 0.08, 1: 0.27, 2: 0.35, 3: 0.18, 4: 0.12}
TAG_LENGTHS = {0: 0.12, 1: 0.45, 2: 0.25, 3: 0.18}
VERBS = (
    "asks about",
    "wants to cancel",
    "reports a problem with",
    "requests a refund for",
    "complains about",
    "needs help with",
)
OBJECTS = ("order", "invoice", "subscription", "delivery", "account", "payment")

ENUM_FIELDS = ("intent", "priority", "sentiment", "language")


@dataclass(frozen=True)
class Drift:
    """What a window changes against the baseline's distribution (the defaults are the baseline)."""

    email_presence: float = 0.70  # customer.email filled
    follow_up_presence: float = 0.30  # follow_up object present
    language_presence: float = 1.0  # language present (0: the field vanished)
    confidence_string_share: float = 0.0  # confidence sent as a string ("0.87")
    confidence_whole_share: float = 0.0  # confidence sent as a whole number (0 or 1)
    quantity_fraction_share: float = 0.0  # quantity (whole numbers) sent as a fraction (2.5)
    eta_string_share: float = 0.25  # eta_days as "unknown" instead of a number of days
    # Extra values of top-level enum fields: {"priority": {"URGENT": 0.1}} (shares of all outputs).
    extra_values: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # Replaced weights of a top-level enum field: {"priority": {"low": 0.5, ...}}.
    weights: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    entities_extra: int = 0  # items added to every entities array
    new_key_share: float = 0.0  # share of outputs carrying a key the baseline never had


NO_DRIFT = Drift()


def _pick(rnd: random.Random, weights: Mapping[Any, float]) -> Any:
    x = rnd.random() * sum(weights.values())
    acc = 0.0
    last = None
    for value, w in weights.items():
        acc += w
        last = value
        if x < acc:
            return value
    return last


def _enum(rnd: random.Random, name: str, default: Mapping[str, float], drift: Drift) -> str:
    extra = drift.extra_values.get(name, {})
    x = rnd.random()
    acc = 0.0
    for value, share in extra.items():
        acc += share
        if x < acc:
            return value
    return str(_pick(rnd, drift.weights.get(name, default)))


def synth_output(rnd: random.Random, drift: Drift = NO_DRIFT) -> dict[str, Any]:
    """One realistic output (see the module docstring); ``drift`` moves one thing or several."""
    r = rnd.random
    if r() < drift.confidence_string_share:
        confidence: Any = f"{rnd.uniform(0.5, 0.99):.2f}"
    elif r() < drift.confidence_whole_share:
        confidence = rnd.choice([0, 1])
    else:
        confidence = round(rnd.uniform(0.5, 0.99), 2)
    amount: Any = rnd.randint(1, 500) if r() < 0.4 else round(rnd.uniform(1, 500), 2)
    quantity: Any = rnd.randint(1, 5)
    if r() < drift.quantity_fraction_share:
        quantity += 0.5
    customer: dict[str, Any] = {"id": f"c-{rnd.randrange(10**6):06d}", "tier": _pick(rnd, TIER)}
    if r() < drift.email_presence:
        customer["email"] = f"user{rnd.randrange(10**6)}@example.com"
    entities = [
        {
            "type": _pick(rnd, ENTITY_TYPE),
            "value": f"{rnd.choice('AB')}-{rnd.randrange(10**5)}",
            "confidence": round(rnd.uniform(0.3, 0.99), 2),
        }
        for _ in range(_pick(rnd, ENTITY_LENGTHS) + drift.entities_extra)
    ]
    out: dict[str, Any] = {
        "intent": _enum(rnd, "intent", INTENT, drift),
        "priority": _enum(rnd, "priority", PRIORITY, drift),
        "sentiment": _enum(rnd, "sentiment", SENTIMENT, drift),
    }
    if r() < drift.language_presence:
        out["language"] = _enum(rnd, "language", LANGUAGE, drift)
    out.update(
        {
            "confidence": confidence,
            "summary": f"Customer {rnd.choice(VERBS)} {rnd.choice(OBJECTS)} {rnd.randrange(10**7):07d}",
            "requires_human": r() < 0.15,
            "amount": amount,
            "quantity": quantity,
            "eta_days": "unknown" if r() < drift.eta_string_share else rnd.randint(1, 14),
            "customer": customer,
            "entities": entities,
            "tags": rnd.sample(TAGS, _pick(rnd, TAG_LENGTHS)),
            "reference": f"REF-{rnd.randrange(10**6)}" if r() < 0.8 else None,
        }
    )
    if r() < drift.follow_up_presence:
        out["follow_up"] = {"channel": _pick(rnd, CHANNEL), "within_hours": rnd.choice([4, 24, 48])}
    if r() < drift.new_key_share:
        out["escalation_reason"] = rnd.choice(["legal threat", "vip customer", "repeated contact"])
    return out


def synth_outputs(seed: int, n: int, drift: Drift = NO_DRIFT) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    return [synth_output(rnd, drift) for _ in range(n)]


def write_outputs(
    store: Store,
    outputs: Sequence[dict[str, Any]],
    since: datetime,
    span: timedelta,
    *,
    prompt_version: str = PROMPT,
    model: str = MODEL,
    contract: str = CONTRACT,
    batch: int = 2000,
    id_prefix: str | None = None,
    served_model: str | None = None,
    finish_reasons: dict[int, str] | None = None,
    source: str | None = "production",
) -> None:
    """Store ``outputs`` through the ingest path, evenly spread over ``[since, since + span)``
    (answered by ``served_model``; by default the model requested; sent as ``source``, None: without
    one; output ``i`` with ``finish_reasons[i]`` when given)."""
    seconds = int(span.total_seconds())
    n = len(outputs)
    prefix = id_prefix or f"{model}/{prompt_version}/{contract}/{since.isoformat()}"
    envs = []
    for i, out in enumerate(outputs):
        ts = since + timedelta(seconds=i * seconds // n)
        env = make_envelope(
            event_id=f"{prefix}/{i}",
            ts=ts.isoformat(),
            model=model,
            served_model=served_model or model,
            prompt_version=prompt_version,
            contract=contract,
            output=out,
            source=source,
        )
        if finish_reasons and i in finish_reasons:
            env["finish_reason"] = finish_reasons[i]
        envs.append(parse_envelope(orjson.dumps(env), LIMITS))
        if len(envs) == batch:
            store.write_batch(envs)
            envs = []
    if envs:
        store.write_batch(envs)


# --- reference statistics, computed from the raw outputs (not from the rollups) ------------------


@dataclass
class PathStats:
    units: int = 0
    present: int = 0
    types: Counter[str] = field(default_factory=Counter)
    values: Counter[str] = field(default_factory=Counter)
    lengths: Counter[int] = field(default_factory=Counter)

    @property
    def filled(self) -> int:
        return self.present - self.types["null"]

    @property
    def presence_rate(self) -> float:
        return round(self.filled / self.units, 6)

    def shares(self) -> dict[str, float]:
        """Type shares over filled values, integer counted as number (the rules' view)."""
        merged: Counter[str] = Counter()
        for t, n in self.types.items():
            if t != "null":
                merged["number" if t == "integer" else t] += n
        total = sum(merged.values())
        return {t: round(n / total, 6) for t, n in sorted(merged.items())}

    def raw_shares(self) -> dict[str, float]:
        """Type shares over filled values, integer apart (the new_type view)."""
        filled = {t: n for t, n in self.types.items() if t != "null"}
        total = sum(filled.values())
        return {t: round(n / total, 6) for t, n in sorted(filled.items())}

    def percentile(self, q: float) -> int:
        ordered = sorted(self.lengths.elements())
        return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def path_stats(outputs: Iterable[dict[str, Any]], path: str) -> PathStats:
    """Statistics of one path of ``outputs``, with units as the README defines them: the outputs for a
    path outside any array, the items of the innermost array otherwise. (Synthetic keys need no escapes.)"""
    steps: list[str | None] = []
    for part in path.split("."):
        key = part.rstrip("[]") if part.endswith("[]") else part
        steps.append(key)
        steps.extend([None] * ((len(part) - len(key)) // 2))
    last = max((i for i, st in enumerate(steps) if st is None), default=-1)
    units: list[Any] = list(outputs)
    for st in steps[: last + 1]:
        if st is None:
            units = [item for u in units if isinstance(u, list) for item in u]
        else:
            units = [u[st] for u in units if isinstance(u, dict) and st in u]
    s = PathStats(units=len(units))
    for u in units:
        found, v = True, u
        for st in steps[last + 1 :]:
            if not isinstance(v, dict) or st not in v:
                found = False
                break
            v = v[st]
        if not found:
            continue
        s.present += 1
        t = json_type_of(v).value
        s.types[t] += 1
        if isinstance(v, str):
            s.values[v] += 1
        elif isinstance(v, list):
            s.lengths[len(v)] += 1
    return s


# --- aggregates -------------------------------------------------------------------------------


def merge_fields(*profiles: dict[str, FieldProfile]) -> dict[str, FieldProfile]:
    """The field profiles of several cohorts summed as one (what an endpoint-level monitor would see)."""
    out: dict[str, FieldProfile] = {}
    for fields in profiles:
        for path, f in fields.items():
            if path not in out:
                out[path] = f
                continue
            g = out[path]
            out[path] = FieldProfile(
                path,
                f.scope,
                g.units + f.units,
                g.present + f.present,
                _add(g.types, f.types),
                g.long_strings + f.long_strings,
                _add(g.values, f.values),
                g.values_overflow + f.values_overflow,
                _add(g.array_lengths, f.array_lengths),
                _add(g.numbers, f.numbers),
            )
    return out


def _add(a: Mapping[Any, int], b: Mapping[Any, int]) -> dict[Any, int]:
    c: Counter[Any] = Counter(a)
    c.update(b)
    return dict(c)
