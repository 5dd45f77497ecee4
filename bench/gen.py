"""Realistic envelopes for benchmarks and tests, as dicts or as a JSONL file.

Each envelope carries a support-ticket triage output (24 leaf paths, nested
objects, arrays of objects, optional keys that are sometimes absent and
sometimes null) from one of five cohorts, with timestamps spread evenly over
the 24 hours before 2026-11-29T00:00:00Z. The same seed always gives the same
file, and every ``event_id`` is unique within a seed.

Command line::

    python bench/gen.py --n 1000000 --out /tmp/envelopes.jsonl [--seed 1] [--gz]

From Python (``bench`` is not a package: put its directory on ``sys.path``)::

    sys.path.insert(0, str(repo / "bench"))
    from gen import make_envelopes
    for envelope in make_envelopes(1000, seed=7):
        ...

Speed comes from drawing with ``random.random()`` into precomputed pools and
weight tables, and from writing orjson bytes in large chunks.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

END = datetime(2026, 11, 29, tzinfo=UTC)
SPAN = timedelta(hours=24)

INTENTS = (
    "refund",
    "billing_question",
    "bug_report",
    "account_access",
    "cancellation",
    "feature_request",
    "shipping_status",
    "complaint",
)
PRIORITIES = ("low", "medium", "high", "urgent")
LANGUAGES = ("en", "es", "de", "fr", "pt", "ja", "it", "nl")
TIERS = ("free", "pro", "business", "enterprise")
REGIONS = ("na", "emea", "apac", "latam")
ENTITY_TYPES = ("order_id", "product", "email", "phone", "date", "amount", "person", "location")
TAGS = (
    "refund", "billing", "login", "mobile", "web", "shipping", "damaged", "late",
    "vip", "repeat_contact", "angry", "legal", "security", "outage", "discount",
)
QUEUE_BY_INTENT = {
    "refund": "billing",
    "billing_question": "billing",
    "bug_report": "technical",
    "account_access": "accounts",
    "cancellation": "retention",
    "feature_request": "general",
    "shipping_status": "logistics",
    "complaint": "general",
}
# Priority weights (low, medium, high, urgent) per intent.
PRIORITY_WEIGHTS = {
    "refund": (20, 45, 28, 7),
    "billing_question": (40, 45, 13, 2),
    "bug_report": (15, 40, 33, 12),
    "account_access": (10, 35, 40, 15),
    "cancellation": (15, 35, 38, 12),
    "feature_request": (70, 25, 5, 0),
    "shipping_status": (30, 45, 20, 5),
    "complaint": (10, 30, 40, 20),
}
SENTIMENT_BASE = {
    "refund": -0.3,
    "billing_question": 0.0,
    "bug_report": -0.2,
    "account_access": -0.25,
    "cancellation": -0.45,
    "feature_request": 0.3,
    "shipping_status": -0.1,
    "complaint": -0.65,
}
SLA_MINUTES = {"low": 1440, "medium": 480, "high": 120, "urgent": 30}
URGENCY = {"low": 1, "medium": 2, "high": 4, "urgent": 5}
ESCALATION = {"low": 0, "medium": 0, "high": 1, "urgent": 2}


@dataclass(frozen=True)
class Cohort:
    """One (model, prompt version, contract) population and how its outputs behave.

    >>> Cohort("gpt-4o", "gpt-4o-2024-08-06", "triage-v1", "triage", "1", share=0.25,
    ...        tier_filled=0.6, tier_null=0.1, reply_null=0.1, followup_share=0.3,
    ...        intent_weights=(1, 1, 1, 1, 1, 1, 1, 1))  # doctest: +ELLIPSIS
    Cohort(model='gpt-4o', ...)
    """

    model: str
    served_model: str
    prompt_version: str
    contract: str
    contract_version: str
    share: float
    tier_filled: float
    """Share of outputs with ``customer.tier`` present and not null."""
    tier_null: float
    """Share with ``customer.tier`` present as null; the rest omit the key."""
    reply_null: float
    """Share with ``reply_draft`` null among outputs that do not need a human."""
    followup_share: float
    """Share with ``followup_at`` present (it is absent otherwise)."""
    intent_weights: tuple[int, ...]
    """Weights in the order of ``INTENTS``."""


COHORTS = (
    Cohort("claude-sonnet-4-5-20250929", "claude-sonnet-4-5-20250929", "intake-v3", "intake", "3",
           share=0.30, tier_filled=0.62, tier_null=0.08, reply_null=0.35, followup_share=0.35,
           intent_weights=(16, 18, 14, 10, 8, 6, 16, 12)),
    # A prompt rollout on a tenth of the traffic: the case per-cohort monitoring exists for.
    Cohort("claude-sonnet-4-5-20250929", "claude-sonnet-4-5-20250929", "intake-v4", "intake", "3",
           share=0.10, tier_filled=0.60, tier_null=0.05, reply_null=0.30, followup_share=0.40,
           intent_weights=(16, 18, 14, 10, 8, 6, 16, 12)),
    Cohort("gpt-4o-2024-08-06", "gpt-4o-2024-08-06", "intake-v3", "intake", "3",
           share=0.20, tier_filled=0.58, tier_null=0.12, reply_null=0.40, followup_share=0.30,
           intent_weights=(15, 19, 13, 11, 9, 6, 15, 12)),
    # A floating alias: the served model is the dated snapshot behind it.
    Cohort("gpt-4o", "gpt-4o-2024-08-06", "triage-v1", "triage", "1",
           share=0.25, tier_filled=0.60, tier_null=0.10, reply_null=0.45, followup_share=0.25,
           intent_weights=(12, 14, 20, 14, 10, 8, 10, 12)),
    Cohort("gemini-2.5-pro", "gemini-2.5-pro", "triage-v1", "triage", "1",
           share=0.15, tier_filled=0.61, tier_null=0.02, reply_null=0.50, followup_share=0.20,
           intent_weights=(12, 14, 20, 14, 10, 8, 10, 12)),
)

_FIRST_NAMES = (
    "Ana", "Ben", "Chloe", "Daniel", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Kavya", "Liam", "Maria", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sven", "Tomoko",
)
_LAST_NAMES = (
    "Almeida", "Berg", "Chen", "Dubois", "Eriksen", "Fischer", "Garcia", "Hughes",
    "Ivanova", "Jensen", "Kowalski", "Lopez", "Müller", "Nakamura", "Okafor", "Rossi",
)
_PRODUCTS = (
    "Aero 14 laptop", "Pulse earbuds", "Nimbus router", "Vanta desk lamp", "Orbit smartwatch",
    "Kettle Pro 2", "Atlas backpack", "Photon monitor 27\"", "Echo mini speaker",
    "Trail running shoes", "Cedar standing desk", "Flux phone case", "Zen yoga mat",
    "Polar thermos", "Spark e-reader", "Harbor rain jacket", "Nova webcam", "Quill tablet pen",
    "annual Premium plan", "Team workspace add-on", "extra storage 2 TB", "gift card",
)
_CITIES = (
    "Lisbon", "Berlin", "Austin", "Osaka", "São Paulo", "Toronto", "Nairobi", "Melbourne",
    "Madrid", "Utrecht", "Lyon", "Seoul", "Denver", "Milan", "Mexico City",
)
_MAINS = {
    "refund": (
        "Refund request for the {product}, order {order}",
        "Wants {amount} back for a faulty {product}",
        "Asks to return the {product} bought on {date}",
        "Charged {amount} for an unused {product}",
    ),
    "billing_question": (
        "Asks why the invoice shows {amount}",
        "Question about a {amount} charge on {date}",
        "Asks about proration for the {product}",
        "Needs a VAT invoice for order {order}",
    ),
    "bug_report": (
        "The {product} app crashes on sync",
        "Checkout fails after card entry, order {order}",
        "{product} stuck on boot after firmware update",
        "CSV export empty since {date}",
    ),
    "account_access": (
        "Cannot log in; reset email never arrives",
        "Locked out after failed two-factor attempts",
        "Wants to move the account to a new email",
        "Account suspended after a {amount} payment",
    ),
    "cancellation": (
        "Wants to cancel the {product} before renewal",
        "Asks to close the account and delete all data",
        "Cancelling: price rose to {amount} a month",
        "Cancel order {order} placed on {date}",
    ),
    "feature_request": (
        "Suggests dark mode for the {product} app",
        "Asks for shared family accounts on {product}",
        "Wants an API to export order history",
        "Requests calendar sync for delivery slots",
    ),
    "shipping_status": (
        "Where is order {order}? No tracking since {date}",
        "Order {order} marked delivered, never arrived",
        "Change delivery address for the {product}",
        "Asks for a delivery estimate to {city}",
    ),
    "complaint": (
        "Third faulty {product} in a month",
        "Charged {amount} twice, no answer for a week",
        "{product} left in the rain, arrived damaged",
        "Three tickets about order {order}, unresolved",
    ),
}
_CLAUSES = (
    "mentions contacting support twice already",
    "wants an answer today",
    "says a colleague has the same problem",
    "threatens to post a public review",
    "has been a customer for several years",
    "attached a screenshot of the error",
    "prefers a call back over email",
    "is travelling until next week",
    "asks for a discount as compensation",
    "tone is polite but firm",
    "mentions a chargeback with the bank",
    "already tried restarting and reinstalling",
    "writes on behalf of a team of twenty",
    "confused by the previous agent's answer",
    "needs it resolved before a deadline on Friday",
    "notes the issue started after the last update",
)
_GREETINGS = ("Hi {name},", "Hello {name},", "Dear {name},", "Hi there,", "Hello,", "Thanks for reaching out,")
_BODIES = {
    "refund": (
        "I've started a refund of {amount}; it shows up within 5-7 business days.",
        "Your return for order {order} is approved; the refund follows the carrier scan.",
    ),
    "billing_question": (
        "The {amount} includes the prorated change made on {date}; breakdown attached.",
        "Reply with your VAT number and I'll send a corrected invoice.",
    ),
    "bug_report": (
        "A fix for the sync crash ships in the next release; signing out and in avoids it.",
        "Which version of the {product} app are you running?",
    ),
    "account_access": (
        "I've cleared the lockout and sent a new reset link to the address on file.",
        "Please confirm the last four digits of the card used for order {order}.",
    ),
    "cancellation": (
        "Cancellation is set for the end of this billing period; no further charges.",
        "I can offer three months at half price; reply 'cancel' to go ahead anyway.",
    ),
    "feature_request": (
        "Thanks! I've shared the idea with our product team.",
        "Good idea; I've added your vote to the request.",
    ),
    "shipping_status": (
        "Order {order} is in transit to {city}, expected in two business days.",
        "I've opened a carrier investigation for order {order}.",
    ),
    "complaint": (
        "I'm sorry; a senior agent will contact you within one business day.",
        "I've refunded the duplicate charge of {amount} and added a credit.",
    ),
}
_CLOSINGS = ("Best, Support", "Thanks, Alex", "", "", "")

_M64 = (1 << 64) - 1
_M62 = (1 << 62) - 1
_POOL = 400  # pre-rendered variants per template family


def _weight_table(items: Sequence[Any], weights: Sequence[float], size: int = 1000) -> list[Any]:
    """A lookup list in which each item fills a share of slots equal to its weight."""
    total = sum(weights)
    table: list[Any] = []
    acc = 0.0
    for item, weight in zip(items, weights, strict=True):
        acc += weight
        table.extend([item] * (round(acc / total * size) - len(table)))
    return table


def _mix64(z: int) -> int:
    # splitmix64's finaliser: a bijection on 64-bit integers.
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix62(z: int) -> int:
    # xor-shifts and odd multipliers modulo 2**62: a bijection on 62-bit integers,
    # so ids stay unique after the two variant bits take the top of the low word.
    z = ((z ^ (z >> 31)) * 0xBF58476D1CE4E5B9) & _M62
    z = ((z ^ (z >> 29)) * 0x94D049BB133111EB) & _M62
    return z ^ (z >> 32)


def event_id(seed: int, index: int) -> str:
    """The version-4-shaped UUID string of envelope ``index`` for ``seed``; unique per seed."""
    return _event_id(_mix64(seed & _M64), index)


def _event_id(key: int, index: int) -> str:
    # The low word alone is a bijection of the index, so ids never collide within a seed.
    hi = (_mix64((index ^ ~key) & _M64) & ~0xF000) | 0x4000
    lo = (2 << 62) | _mix62((index + key) & _M62)
    h = f"{hi:016x}{lo:016x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class _Pools:
    """Strings rendered once per generator so the per-event loop only indexes lists."""

    def __init__(self, rng: random.Random, start: datetime) -> None:
        r = rng.random
        names = [f"{a} {b}" for a in _FIRST_NAMES for b in _LAST_NAMES]
        self.persons = names
        self.emails = [
            f"{n.split()[0].lower()}.{n.split()[1].lower()}{int(r() * 100)}@{d}"
            for n in names
            for d in ("gmail.com", "outlook.com", "example.org")
        ]
        self.orders = [f"ORD-{int(r() * 9_000_000) + 1_000_000}" for _ in range(5000)]
        self.amounts = [f"${int(r() * 50000) / 100:.2f}" for _ in range(2000)]
        self.phones = [f"+{int(r() * 90) + 1} {int(r() * 900) + 100} {int(r() * 9_000_000) + 1_000_000}"
                       for _ in range(2000)]
        self.dates = [(start - timedelta(days=d)).strftime("%Y-%m-%d") for d in range(60)]
        self.products = list(_PRODUCTS)
        self.cities = list(_CITIES)
        by_type = {
            "order_id": self.orders, "product": self.products, "email": self.emails,
            "phone": self.phones, "date": self.dates, "amount": self.amounts,
            "person": self.persons, "location": self.cities,
        }
        self.entity_values = [by_type[t] for t in ENTITY_TYPES]
        self.mains = {i: [self._render(rng, t) for t in _MAINS[i] for _ in range(_POOL // 4)]
                      for i in INTENTS}
        self.bodies = {i: [self._render(rng, t) for t in _BODIES[i] for _ in range(_POOL // 8)]
                       for i in INTENTS}
        self.greetings = [g.format(name=n.split()[0]) for g in _GREETINGS for n in names[::7]]
        self.customers = [
            (f"cus_{rng.getrandbits(40):010x}", REGIONS[int(r() * 4)], TIERS[int(r() ** 1.6 * 4)],
             int(r() ** 2 * 3000))
            for _ in range(20000)
        ]

    def _render(self, rng: random.Random, template: str) -> str:
        return template.format(
            product=rng.choice(self.products), order=rng.choice(self.orders),
            amount=rng.choice(self.amounts), date=rng.choice(self.dates),
            city=rng.choice(self.cities),
        )


def cohorts_of(k: int | None) -> tuple[Cohort, ...]:
    """The five cohorts above, or ``k`` cohorts of equal share: the five again and again, each
    repeat under prompt versions of its own (``intake-v3.1``, ...)."""
    if k is None:
        return COHORTS
    if k < 1:
        raise ValueError("cohorts must be at least 1")
    return tuple(
        dataclasses.replace(
            COHORTS[i % len(COHORTS)],
            prompt_version=COHORTS[i % len(COHORTS)].prompt_version + (f".{i // len(COHORTS)}" if i >= len(COHORTS) else ""),
            share=1 / k,
        )
        for i in range(k)
    )


def make_envelopes(
    n: int, seed: int = 1, start: datetime | None = None, span: timedelta = SPAN, cohorts: int | None = None
) -> Iterator[dict[str, Any]]:
    """Yield ``n`` envelopes with timestamps spread evenly over ``[start, start + span)`` (24 h).

    ``start`` defaults to ``span`` before 2026-11-29T00:00:00Z, so the last event falls just
    before it. Timestamps increase with the index (strictly, while ``n`` stays under the span's
    milliseconds, since they carry milliseconds). ``cohorts``: how many (``cohorts_of``).
    """
    if start is None:
        start = END - span
    if start.tzinfo is None:
        raise ValueError("start must carry a time zone")
    rng = random.Random(seed)
    r = rng.random
    pools = _Pools(rng, start)

    chosen = cohorts_of(cohorts)
    cohort_table = _weight_table([(c, _weight_table(INTENTS, c.intent_weights, 200)) for c in chosen],
                                 [c.share for c in chosen])
    priority_tables = {i: _weight_table(PRIORITIES, PRIORITY_WEIGHTS[i], 100) for i in INTENTS}
    language_table = _weight_table(LANGUAGES, (62, 10, 8, 7, 5, 4, 2, 2), 100)
    entity_count_table = _weight_table(range(7), (50, 30, 10, 5, 3, 1, 1), 100)
    tag_count_table = _weight_table(range(6), (15, 35, 28, 12, 7, 3), 100)
    entity_values = pools.entity_values
    pii_types = {ENTITY_TYPES.index(t) for t in ("email", "phone", "person")}
    customers, mains, bodies = pools.customers, pools.mains, pools.bodies
    greetings, clauses = pools.greetings, _CLAUSES
    n_customers, n_greetings, n_clauses = len(customers), len(greetings), len(clauses)
    n_mains, n_bodies = len(mains[INTENTS[0]]), len(bodies[INTENTS[0]])

    start_ms = int(start.timestamp() * 1000)
    span_ms = int(span.total_seconds() * 1000)
    key = _mix64(seed & _M64)
    last_second = -1
    second_prefix = ""
    hour_cache: dict[int, str] = {}

    for index in range(n):
        t_ms = start_ms + index * span_ms // n
        second, ms = divmod(t_ms, 1000)
        if second != last_second:
            last_second = second
            second_prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")

        cohort, intent_table = cohort_table[int(r() * 1000)]
        intent = intent_table[int(r() * 200)]
        priority = priority_tables[intent][int(r() * 100)]
        cust_id, region, tier, age = customers[int(r() * n_customers)]

        # 40 to 200 characters, most of them short: a main phrase plus a clause or more.
        summary = mains[intent][int(r() * n_mains)]
        target = 40 + int(r() ** 4 * 161)
        clause = clauses[int(r() * n_clauses)]
        while len(summary) < 40 or len(summary) + len(clause) + 2 <= target:
            summary = f"{summary}; {clause}"
            clause = clauses[int(r() * n_clauses)]
        if len(summary) > 200:
            summary = summary[:197].rstrip(" ;") + "..."

        entities = []
        pos = int(r() * 40)
        has_pii = False
        for _ in range(entity_count_table[int(r() * 100)]):
            t = int(r() * 8)
            values = entity_values[t]
            value = values[int(r() * len(values))]
            pos += int(r() * 60)
            end = pos + len(value)
            entities.append({"type": ENTITY_TYPES[t], "value": value, "start": pos, "end": end})
            pos = end + 1
            has_pii = has_pii or t in pii_types

        sentiment = SENTIMENT_BASE[intent] + (r() - 0.5) * 0.9
        sentiment = -1.0 if sentiment < -1.0 else 1.0 if sentiment > 1.0 else int(sentiment * 100) / 100
        confidence = (55 + int(r() ** 0.5 * 45)) / 100
        urgency = URGENCY[priority] + (1 if r() < 0.15 and priority != "urgent" else 0)
        escalation = ESCALATION[priority] + (1 if r() < 0.1 else 0)
        needs_human = priority == "urgent" or confidence < 0.7 or r() < 0.08

        customer: dict[str, Any] = {"id": cust_id, "region": region, "account_age_days": age}
        u = r()
        if u < cohort.tier_filled:
            customer["tier"] = tier
        elif u < cohort.tier_filled + cohort.tier_null:
            customer["tier"] = None

        output: dict[str, Any] = {
            "intent": intent,
            "priority": priority,
            "confidence": confidence,
            "language": language_table[int(r() * 100)],
            "summary": summary,
            "customer": customer,
        }
        # An absent array and an empty array are different facts: keep both.
        if r() >= 0.02:
            output["entities"] = entities
        output["tags"] = [TAGS[int(r() * 15)] for _ in range(tag_count_table[int(r() * 100)])]
        output["flags"] = {"needs_human": needs_human, "pii_detected": has_pii, "sentiment": sentiment}
        # No draft when a human has to answer anyway.
        output["reply_draft"] = None if needs_human or r() < cohort.reply_null else (
            f"{greetings[int(r() * n_greetings)]} {bodies[intent][int(r() * n_bodies)]} "
            f"{_CLOSINGS[int(r() * 5)]}".rstrip()
        )
        if r() < cohort.followup_share:
            hour = second // 3600 + 2 + int(r() * 70)
            followup = hour_cache.get(hour)
            if followup is None:
                followup = datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y-%m-%dT%H:00:00Z")
                hour_cache[hour] = followup
            output["followup_at"] = followup
        output["scores"] = {
            "urgency": urgency,
            "churn_risk": None if r() < 0.03 else int(
                (0.6 if intent == "cancellation" else 0.15) * 100 + r() * 40) / 100,
        }
        output["routing"] = {
            "queue": QUEUE_BY_INTENT[intent],
            "escalation_level": escalation,
            "sla_minutes": SLA_MINUTES[priority],
        }
        yield {
            "event_id": _event_id(key, index),
            "ts": f"{second_prefix}.{ms:03d}Z",
            "model": cohort.model,
            "served_model": cohort.served_model,
            "prompt_version": cohort.prompt_version,
            "contract": cohort.contract,
            "contract_version": cohort.contract_version,
            "source": "production",
            "output": output,
        }


def write_jsonl(path: Path, n: int, seed: int = 1, gz: bool = False,
                start: datetime | None = None, span: timedelta = SPAN, cohorts: int | None = None) -> int:
    """Write ``n`` envelopes to ``path``, one per line; return the uncompressed byte count."""
    dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
    written = 0
    chunk: list[bytes] = []
    # gzip level 1: the file is an input, not an archive, and level 9 would triple the time.
    with gzip.open(path, "wb", compresslevel=1) if gz else open(path, "wb") as out:
        for envelope in make_envelopes(n, seed=seed, start=start, span=span, cohorts=cohorts):
            chunk.append(dumps(envelope, option=newline))
            if len(chunk) == 10_000:
                data = b"".join(chunk)
                out.write(data)
                written += len(data)
                chunk.clear()
        data = b"".join(chunk)
        out.write(data)
        written += len(data)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints a one-line summary on stderr."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="number of envelopes (default 1,000,000)")
    parser.add_argument("--out", type=Path, required=True, help="output file (JSONL, or .jsonl.gz with --gz)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--gz", action="store_true", help="gzip the output (level 1)")
    parser.add_argument("--days", type=float, default=1.0, help="span of the timestamps in days (default 1)")
    parser.add_argument("--cohorts", type=int, default=None, help="number of cohorts of equal share (default: the five)")
    args = parser.parse_args(argv)
    if args.n < 0:
        parser.error("--n must be >= 0")
    began = time.perf_counter()
    if args.days <= 0 or (args.cohorts is not None and args.cohorts < 1):
        parser.error("--days must be > 0 and --cohorts >= 1")
    written = write_jsonl(
        args.out, args.n, seed=args.seed, gz=args.gz, span=timedelta(days=args.days), cohorts=args.cohorts
    )
    elapsed = time.perf_counter() - began
    print(
        f"{args.n:,} envelopes, {written / 1e6:,.1f} MB uncompressed "
        f"({written / max(args.n, 1):.0f} B/line) in {elapsed:.1f} s "
        f"({args.n / elapsed:,.0f} lines/s) -> {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
