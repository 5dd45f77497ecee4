"""Time to page: minutes from the onset of a change to the alert that says it, per case and rate.

    .venv/bin/python bench/detect.py [--rates 20,2] [--horizon 24h] [--cases vanish,drop30,...]
                                           [--workdir DIR] [--json OUT]

For each traffic rate (outputs per minute), a real DuckDB file gets a baseline day of stable
traffic (frozen) and a second day of the same traffic; at the onset ``T0`` (the start of the
third day) one thing changes and stays changed. The analyzer's evaluations are then replayed
every ``interval`` (5 minutes) from ``T0``, states carried from one to the next exactly as the
service carries them (``analysis.alerts.step``), until the expected alert fires or the horizon
is reached. Each case is run twice: with the default short windows (15 min at 3x every effect
threshold, 1 h at 2x, 6 h at 1.5x) and with the 24-hour window alone (what shapewatch did
before), so the table shows what the short windows buy.

Cases (each on one field of an output that otherwise never changes):

- ``vanish``: ``notes``, filled in every output, stops appearing;
- ``drop30``: ``customer.email`` filled in 90% of outputs drops to 60%;
- ``new_type``: ``confidence`` arrives as a string in 25% of outputs;
- ``new_enum``: ``priority`` takes a value never seen (``URGENT``) in 20% of outputs;
- ``array_p50``: ``tags`` array lengths double (p50 2 -> 4).

It prints one row per case and rate: the minutes to the alert (``-`` if none within the
horizon), its kind, severity and the window it breached on, for both configurations.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from shapewatch.analysis.alerts import ALERTS_SCHEMA, Alert, AlertState, step
from shapewatch.analysis.analyzer import evaluate
from shapewatch.analysis.config import AnalyzerConfig
from shapewatch.baselines import BASELINES_SCHEMA, Cohort, freeze_baseline
from shapewatch.collector import Store
from shapewatch.collector.envelope import LIMITS, parse_envelope

DAY = timedelta(days=1)
START = datetime(2026, 11, 1, tzinfo=UTC)  # day 0: the baseline; day 1: the same traffic
T0 = START + 2 * DAY  # the onset
COHORT = Cohort("claude-sonnet-4-5-20250929", "intake-v3", "intake")
SCHEMAS = [BASELINES_SCHEMA, ALERTS_SCHEMA]
PRIORITY = {"low": 0.45, "medium": 0.35, "high": 0.20}
TAGS = ("billing", "delivery", "refund", "account", "bug", "feedback", "legal", "vip")
TAG_LENGTHS = {1: 0.30, 2: 0.40, 3: 0.30}  # p50 2


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pick(rnd: random.Random, weights: dict[Any, float]) -> Any:
    x = rnd.random()
    acc = 0.0
    for value, w in weights.items():
        acc += w
        if x < acc:
            return value
    return value


def output(rnd: random.Random, case: str | None) -> dict[str, Any]:
    """One output; ``case`` (after the onset) changes one field, None is the stable traffic."""
    r = rnd.random
    n_tags = _pick(rnd, TAG_LENGTHS) * (2 if case == "array_p50" else 1)
    out: dict[str, Any] = {
        "intent": rnd.choice(("refund", "billing", "shipping", "cancel")),
        "priority": "URGENT" if case == "new_enum" and r() < 0.20 else _pick(rnd, PRIORITY),
        "confidence": round(rnd.uniform(0.5, 0.99), 2),
        "customer": {"id": f"c-{rnd.randrange(10**6):06d}"},
        "tags": [rnd.choice(TAGS) for _ in range(n_tags)],
    }
    if case == "new_type" and r() < 0.25:
        out["confidence"] = f"{out['confidence']:.2f}"
    if r() < (0.60 if case == "drop30" else 0.90):
        out["customer"]["email"] = f"user{rnd.randrange(10**6)}@example.com"
    if case != "vanish":
        out["notes"] = f"customer wrote {rnd.randrange(10**7)}"
    return out


def write(store: Store, since: datetime, minutes: int, rate: int, case: str | None, seed: int) -> int:
    """``rate`` outputs per minute for ``minutes`` minutes from ``since``, through the ingest path."""
    rnd = random.Random(seed)
    envs = []
    n = 0
    for m in range(minutes):
        for i in range(rate):
            ts = since + timedelta(minutes=m, seconds=60 * i / rate)
            env = {
                "event_id": f"{seed}/{m}/{i}",
                "ts": ts.isoformat(),
                "model": COHORT.model,
                "prompt_version": COHORT.prompt_version,
                "contract": COHORT.contract,
                "output": output(rnd, case),
            }
            envs.append(parse_envelope(orjson.dumps(env), LIMITS))
            n += 1
            if len(envs) >= 5000:
                store.write_batch(envs)
                envs = []
    if envs:
        store.write_batch(envs)
    return n


@dataclass(frozen=True)
class Case:
    name: str
    field: str
    kinds: tuple[str, ...]  # the alert kinds that say it
    words: str


CASES = (
    Case("vanish", "notes", ("presence_drop", "field_missing"), "a field filled in 100% vanishes"),
    Case("drop30", "customer.email", ("presence_drop",), "presence 90% -> 60% (30 points)"),
    Case("new_type", "confidence", ("new_type",), "a new type (string) on 25% of values"),
    Case("new_enum", "priority", ("new_enum_value", "unknown_enum_growth"), "a new enum value on 20%"),
    Case("array_p50", "tags", ("array_size_shift",), "array-size p50 doubles (2 -> 4)"),
)


def template(workdir: Path, rate: int) -> Path:
    """A baseline day (frozen) and a second day of the same traffic, at ``rate`` per minute."""
    path = workdir / f"template-{rate}.duckdb"
    t = time.perf_counter()
    with Store.open(path, schemas=SCHEMAS) as store:
        n = write(store, START, 1440, rate, None, seed=1)
        freeze_baseline(store, COHORT, START, START + DAY, author="bench", note="baseline day", now=START + DAY)
        n += write(store, START + DAY, 1440, rate, None, seed=2)
    _log(f"rate {rate}/min: {n:,} stable outputs written and a baseline frozen in {time.perf_counter() - t:.1f} s")
    return path


def time_to_page(
    store: Store, case: Case, config: AnalyzerConfig, horizon: timedelta
) -> tuple[float | None, Alert | None, int]:
    """Minutes from T0 to the first firing alert of ``case``'s field and kinds, and evaluations run."""
    alerts: dict[str, Alert] = {}
    k = 0
    while config.interval * (k + 1) <= horizon:
        k += 1
        at = T0 + config.interval * k
        evaluation = evaluate(store, config, at)
        changed, _ = step(alerts, [j for r in evaluation.cohorts if (j := r.judged())], config, at)
        alerts.update(changed)
        for a in changed.values():
            if a.state is AlertState.firing and a.field == case.field and a.kind.value in case.kinds:
                return (at - T0).total_seconds() / 60, a, k
    return None, None, k


def run_case(
    tpl: Path, workdir: Path, case: Case, rate: int, horizon: timedelta, configs: dict[str, AnalyzerConfig]
) -> dict[str, Any]:
    path = workdir / f"{case.name}-{rate}.duckdb"
    shutil.copyfile(tpl, path)
    row: dict[str, Any] = {"case": case.name, "rate": rate, "change": case.words}
    with Store.open(path, schemas=SCHEMAS) as store:
        write(store, T0, int(horizon.total_seconds() // 60), rate, case.name, seed=3)
        for name, config in configs.items():
            t = time.perf_counter()
            minutes, alert, evaluations = time_to_page(store, case, config, horizon)
            row[name] = {
                "minutes": minutes,
                "kind": alert.kind.value if alert else None,
                "severity": alert.severity.value if alert else None,
                "window": alert.diff.get("window") if alert else None,
                "evaluations": evaluations,
                "seconds": round(time.perf_counter() - t, 2),
            }
            _log(f"{case.name} at {rate}/min, {name}: {row[name]}")
    path.unlink()
    return row


def _cell(r: dict[str, Any]) -> str:
    if r["minutes"] is None:
        return "-"
    return f"{r['minutes']:.0f} min ({r['kind']}, {r['severity']}, {r['window']})"


def render(rows: Sequence[dict[str, Any]], horizon: timedelta) -> str:
    head = ["change", "outputs/min", "short windows + 24h", "24h window alone"]
    body = [[r["change"], str(r["rate"]), _cell(r["short"]), _cell(r["24h only"])] for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) + " |" for x in body]
    hours = horizon.total_seconds() / 3600
    lines.append(f"(minutes from onset to the firing alert; '-': none within {hours:g} h; evaluations every 5 min)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default="20,2", help="outputs per minute, comma-separated")
    p.add_argument("--horizon", type=float, default=24.0, help="hours after the onset to give up")
    p.add_argument("--cases", default=",".join(c.name for c in CASES))
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    rates = [int(x) for x in args.rates.split(",")]
    wanted = args.cases.split(",")
    unknown = set(wanted) - {c.name for c in CASES}
    if unknown:
        p.error(f"unknown cases {sorted(unknown)}; known: {', '.join(c.name for c in CASES)}")
    horizon = timedelta(hours=args.horizon)
    configs = {"short": AnalyzerConfig(), "24h only": replace(AnalyzerConfig(), short_windows=())}
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="time-to-page-")) if own else args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for rate in rates:
            tpl = template(workdir, rate)
            rows += [run_case(tpl, workdir, c, rate, horizon, configs) for c in CASES if c.name in wanted]
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    print(render(rows, horizon))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
