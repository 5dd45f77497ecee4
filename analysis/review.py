"""The weekly review report: what the baseline review meeting reads.

For each cohort with traffic in the review period: its active baseline (age,
author, note, own or inherited), whether its model id is an unpinned alias and
which served models answered, the alerts fired, acknowledged and resolved in
the period, a field-by-field table of the baseline against the period
(presence, type shares, new enum values, array-size percentiles), and a
suggested candidate window to freeze next. Then the cohorts without a
baseline and the baselines older than ``max_baseline_age``.

``build_review`` gathers the facts once (a JSON-ready dict); ``render_markdown``
and ``render_html`` only format them. The HTML has small inline SVG charts
(daily events, presence against the baseline) and no script, so it renders
anywhere, including a mail client.

Every stored value (tags, notes, authors, field paths, enum values) is data in
both formats: the Markdown escapes each one (``_md``; a plain identifier as a code span, ``_code``)
so no value makes a link, an image, HTML or a table cell, and the HTML escapes
each one. A cohort whose baseline or data cannot be reviewed is listed under
``errors`` with the reason, and every other cohort is still reviewed. The period
is at most ``MAX_REVIEW_PERIOD``: the review walks it day by day per cohort.

>>> review = build_review(store, config, now=now, period=timedelta(days=7))    # doctest: +SKIP
>>> print(render_markdown(review))                                           # doctest: +SKIP
"""

from __future__ import annotations

import html
import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shapewatch.baselines import Activation, Cohort, Resolved, activation_history, is_unpinned, resolve_baseline
from shapewatch.collector import (
    FieldProfile,
    Profile,
    Store,
    StoreError,
    contract_changes,
    holds_free_text,
    looks_personal,
    read_profile,
)

from .config import MAX_REVIEW_PERIOD, AnalyzerConfig
from .errors import ReviewPeriodTooLong
from .outcome_rates import responses
from .rules import adjust_p_values, compare_profiles, enum_like

__all__ = ["MAX_REVIEW_PERIOD", "build_review", "render_html", "render_markdown"]

logger = logging.getLogger(__name__)

_MAX_FIELDS = 40  # rows per cohort table: the fields with the largest presence moves first
_MAX_STEPS = 31  # points of a field's daily series: days, or equal steps of a longer period
_MAX_ERROR = 500  # characters of a failed cohort's reason: a message may quote a stored value


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _types(f: FieldProfile | None) -> dict[str, float]:
    if f is None:
        return {}
    filled = {t: n for t, n in f.types.items() if t != "null" and n}
    total = sum(filled.values())
    return {t: round(n / total, 4) for t, n in sorted(filled.items())} if total else {}


def _contracts(
    store: Store, cohort_id: int, contract: str, profile: Profile, since: datetime, until: datetime
) -> dict[str, Any]:
    """The contract versions of a cohort's week: tagged, live, new in the week, and what the live
    registered version declares (required and optional fields), for the field rows."""
    live = profile.live_contract_version
    facts = store.contract_validators.facts(contract, live) if live is not None else None
    violations = {path: max(by.values()) for path, by in sorted(profile.violations.items())}
    return {
        "window": {v: sum(by.values()) for v, by in sorted(profile.contract_checks.items()) if v},
        "live": live,
        "checked": profile.checked,
        "violations": violations,
        "changes": [
            {"version": c["version"], "first_seen": _iso(c["first_seen"])}
            for c in contract_changes(store, cohort_id, since, until).get(cohort_id, [])
        ],
        "required": sorted(facts.required) if facts else [],
        "optional": sorted(facts.optional) if facts else [],
    }


def _field_row(
    path: str,
    base: FieldProfile | None,
    cur: FieldProfile | None,
    config: AnalyzerConfig,
    contract: str,
    declared: dict[str, Any] | None = None,
    days: list[tuple[str, FieldProfile | None]] | None = None,
) -> dict[str, Any]:
    rules = config.rules_for(contract, path)
    new_values: list[str] = []
    enum = base is not None and enum_like(base, rules)
    free = any(f is not None and holds_free_text(f) for f in (base, cur)) or bool(
        base is not None and base.types.get("string") and not base.values
    )
    # free text (ids, names, e-mail addresses) has no new values worth a row: only personal data
    if base is not None and cur is not None and enum and not free:
        known = set(rules.allowed) if rules.allowed is not None else set(base.values)
        new_values = sorted((v for v in cur.values if v not in known), key=lambda v: (-cur.values[v], v))[:10]

    def arrays(f: FieldProfile | None) -> list[int | None] | None:
        if f is None or not f.array_lengths:
            return None
        return [f.array_percentile(0.5), f.array_percentile(0.9), f.array_percentile(0.99)]

    def numbers(f: FieldProfile | None) -> list[float | None] | None:
        if f is None or not f.numbers:
            return None
        return [f.number_percentile(0.1), f.number_percentile(0.5), f.number_percentile(0.9)]

    # A week's aggregate dilutes one bad day (72% -> 57% when the day was 30%): the daily series,
    # and the day furthest from the baseline, say what the week hid.
    rates: list[tuple[str, float | None, int]] = [
        (day, round(f.presence_rate, 4) if f and f.units else None, f.units if f else 0) for day, f in (days or [])
    ]
    daily = [{"day": day, "presence": p, "units": n} for day, p, n in rates]
    base_rate = base.presence_rate if base is not None else None
    worst: dict[str, Any] | None = None
    if base_rate is not None:
        moves = [(abs(p - base_rate), day, p) for day, p, _ in rates if p is not None]
        if moves:
            _, day, p = max(moves, key=lambda m: m[0])
            worst = {"day": day, "presence": p, "move": round(100 * (p - base_rate), 1)}
    bt, ct = _types(base), _types(cur)
    type_move = max((abs(bt.get(t, 0.0) - ct.get(t, 0.0)) for t in set(bt) | set(ct)), default=0.0)
    week_move = abs((cur.presence_rate if cur else 0.0) - (base_rate or 0.0))
    status = "new" if base is None else "missing" if cur is None else ""
    new_share = sum(cur.values.get(v, 0) for v in new_values) / cur.filled if cur is not None and cur.filled else 0.0
    change = max(
        week_move,
        abs(worst["move"]) / 100 if worst else 0.0,
        type_move,
        new_share,
        1.0 if status else 0.0,
    )
    return {
        "field": path,
        "presence": [round(base.presence_rate, 4) if base else None, round(cur.presence_rate, 4) if cur else None],
        "samples": [base.units if base else 0, cur.units if cur else 0],
        "types": [bt, ct],
        "new_values": new_values,
        # what the values are: enum (new values listed), free_text (withheld), other (numbers, mixed)
        "values": "free_text" if free else "enum" if enum else "other",
        "arrays": [arrays(base), arrays(cur)],
        "numbers": [numbers(base), numbers(cur)],  # p10, median, p90 (value_shift)
        "daily": daily,
        "worst_day": worst,
        "change": round(change, 4),  # the largest move, as a share: the rows are ranked by it
        "status": status,
        # what the live registered contract expects: required fields always present, optional
        # ones at the baseline's rate
        "declared": (
            "required"
            if declared and path in declared["required"]
            else "optional"
            if declared and path in declared["optional"]
            else None
        ),
    }


def _days(since: datetime, until: datetime) -> list[tuple[datetime, datetime]]:
    """The review period in steps of a day (at most ``_MAX_STEPS`` equal steps for a longer one)."""
    n = max(1, min(_MAX_STEPS, round((until - since) / timedelta(days=1))))
    step = (until - since) / n
    return [(since + step * i, since + step * (i + 1)) for i in range(n)]


def _outcome_shares(store: Store, cohort_id: int, outputs: int, since: datetime, until: datetime) -> dict[str, Any]:
    """Provider outcomes of the period per kind, with their shares of responses (outputs + outcomes)."""
    counts = store.outcomes_by_cohort(since, until).get(cohort_id, {})
    total = responses(outputs, counts)
    return {
        "responses": total,
        "counts": counts,
        "shares": {k: round(n / total, 6) for k, n in counts.items()} if total else {},
    }


def _daily_events(store: Store, cohort_id: int, since: datetime, until: datetime) -> list[list[Any]]:
    return [[day, n] for day, n in store.events_by_day(cohort_id, since, until).items()]


def _alerts(store: Store, cohort: Cohort, since: datetime, until: datetime) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"fired": [], "acknowledged": [], "resolved": []}
    for field, kind, value, severity, state, fired, acked, acked_by, resolved in store.cohort_alert_events(cohort):
        if value is not None and looks_personal(str(value)):
            value = "[withheld]"
        item = {"field": field, "kind": kind, "value": value, "severity": severity, "state": state}
        if fired is not None and since <= fired < until:
            out["fired"].append({**item, "at": _iso(fired)})
        if acked is not None and since <= acked < until:
            out["acknowledged"].append({**item, "at": _iso(acked), "by": acked_by})
        if resolved is not None and since <= resolved < until:
            out["resolved"].append({**item, "at": _iso(resolved)})
    return out


def _candidate(
    store: Store, cohort_id: int, cohort: Cohort, since: datetime, until: datetime, min_samples: int, window: timedelta
) -> dict[str, Any] | None:
    """The latest whole UTC day of the period with enough samples and no page alert in it.

    An alert first seen at T judged the data of ``[T - window, T)``: that is where its change lies.
    """
    pages = [(start - window, stop) for start, stop in store.page_alert_spans(cohort, until)]
    day = until.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    first = since.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    # One grouped read for the whole period; the loop below walks at most MAX_REVIEW_PERIOD + 2 days.
    per_day = store.events_by_day(cohort_id, first, day + timedelta(days=1))
    while day >= since - timedelta(days=1):
        end = day + timedelta(days=1)
        n = per_day.get(f"{day:%Y-%m-%d}", 0)
        clean = not any(start < end and stop >= day for start, stop in pages)
        if n >= min_samples and clean:
            return {"since": _iso(day), "until": _iso(end), "samples": int(n)}
        day -= timedelta(days=1)
    return None


def _differences(
    store: Store, cohort_id: int, candidate: dict[str, Any], baseline: Any, config: AnalyzerConfig, contract: str
) -> list[str]:
    """What the analyzer would flag in the candidate window against the current baseline: freezing
    it accepts these changes as the new normal, which the meeting should do on purpose."""
    day = read_profile(
        store, cohort_id, datetime.fromisoformat(candidate["since"]), datetime.fromisoformat(candidate["until"])
    )
    checks, _ = compare_profiles(
        baseline.fields, baseline.samples, day.fields, day.events, lambda path: config.rules_for(contract, path)
    )
    return [
        f"{c.kind.value} on {c.field}" + (f" = {c.value!r}" if c.value else "") + f": {c.detail}"
        for c in adjust_p_values(checks)
        if c.breach
    ]


def _review_cohort(
    store: Store,
    config: AnalyzerConfig,
    cid: int,
    cohort: Cohort,
    events: int,
    resolved: Resolved | None,
    since: datetime,
    until: datetime,
    max_baseline_age: timedelta,
) -> dict[str, Any]:
    """One cohort's entry of the review (its baseline, alerts, field table and candidate)."""
    profile = read_profile(store, cid, since, until)
    entry: dict[str, Any] = {
        "cohort": cohort._asdict(),
        "events": events,
        "unpinned": is_unpinned(cohort.model),
        "served_models": dict(sorted(profile.served_models.items(), key=lambda kv: -kv[1])),
        "daily_events": _daily_events(store, cid, since, until),
        "alerts": _alerts(store, cohort, since, until),
        "candidate": _candidate(store, cid, cohort, since, until, config.defaults.min_samples, config.window),
        "baseline": None,
        "fields": [],
        "contracts": _contracts(store, cid, cohort.contract, profile, since, until),
        "outcomes": _outcome_shares(store, cid, profile.events, since, until),
    }
    if entry["candidate"] is not None and resolved is not None:
        entry["candidate"]["differs"] = _differences(
            store, cid, entry["candidate"], resolved.baseline, config, cohort.contract
        )
    if resolved is not None:
        b = resolved.baseline
        age = until - b.created_at
        entry["baseline"] = {
            "baseline_id": b.baseline_id,
            "how": resolved.how,
            "cohort": b.cohort._asdict(),
            "created_at": _iso(b.created_at),
            "age_days": round(age.total_seconds() / 86400, 1),
            "author": b.author,
            "note": b.note,
            "samples": b.samples,
            "window": {"since": _iso(b.since), "until": _iso(b.until)},
            "stale": age > max_baseline_age,
        }
        paths = sorted(set(b.fields) | set(profile.fields))
        steps = [(f"{lo:%Y-%m-%d}", read_profile(store, cid, lo, hi)) for lo, hi in _days(since, until)]
        rows = [
            _field_row(
                path,
                b.fields.get(path),
                profile.fields.get(path),
                config,
                cohort.contract,
                entry["contracts"],
                [(day, p.fields.get(path)) for day, p in steps],
            )
            for path in paths
            if not config.rules_for(cohort.contract, path).ignore
        ]
        # ranked by the size of the change, the largest first: the week's, a day's, the types', new values'
        entry["fields"] = sorted(rows, key=lambda r: (-r["change"], r["field"]))[:_MAX_FIELDS]
    return entry


def build_review(
    store: Store,
    config: AnalyzerConfig,
    *,
    now: datetime | None = None,
    period: timedelta = timedelta(days=7),
    max_baseline_age: timedelta = timedelta(days=30),
) -> dict[str, Any]:
    """Every fact the weekly review needs, as one JSON-ready value.

    ``period`` longer than ``MAX_REVIEW_PERIOD`` (or not positive) is refused with
    ``ReviewPeriodTooLong`` before anything is read. A cohort that cannot be reviewed (a
    baseline that does not load, data that does not add up) is listed under ``errors`` with the
    reason; the others are reviewed as usual. A failing store is not one cohort's fault: it raises.
    """
    if not timedelta(0) < period <= MAX_REVIEW_PERIOD:
        raise ReviewPeriodTooLong(period, MAX_REVIEW_PERIOD)
    until = now or datetime.now(UTC)
    since = until - period
    store.flush_rollups()
    current: dict[Cohort, Activation] = {a.cohort: a for a in activation_history(store)}
    rows = store.cohorts()
    first_seen = {Cohort(r.model, r.prompt_version, r.contract, r.source): r.first_seen for r in rows}
    traffic = store.events_by_cohort(since, until)
    # A served cohort (a model's outputs under an alias) that nobody requested by its own id is
    # reviewed through its alias, whose entry lists the models that answered: the baseline
    # decisions are the alias's, unless one was made for the served cohort itself.
    requested = store.requested_cohort_ids()
    cohorts: list[dict[str, Any]] = []
    without: list[dict[str, Any]] = []
    stale: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for cid, m, p, c, _, src in rows:
        cohort = Cohort(m, p, c, src)
        if int(cid) not in requested and cohort not in current:
            continue
        events = traffic.get(int(cid), 0)
        try:
            resolved = resolve_baseline(store, cohort, current=current, first_seen=first_seen)
            if not events and resolved is None:
                continue
            entry = _review_cohort(store, config, int(cid), cohort, events, resolved, since, until, max_baseline_age)
        except StoreError:
            raise
        except Exception as exc:  # one cohort's broken baseline or data must not blind the review of the rest
            logger.exception("review: cohort %s failed", cohort)
            errors.append(
                {"cohort": cohort._asdict(), "events": events, "error": f"{type(exc).__name__}: {exc}"[:_MAX_ERROR]}
            )
            continue
        cohorts.append(entry)
        b = entry["baseline"]
        if b is None:
            without.append({"cohort": cohort._asdict(), "events": events})
        elif b["how"] == "own" and b["stale"]:
            stale.append({"cohort": cohort._asdict(), "baseline_id": b["baseline_id"], "age_days": b["age_days"]})
    return {
        "generated_at": _iso(until),
        "since": _iso(since),
        "until": _iso(until),
        "max_baseline_age_days": round(max_baseline_age.total_seconds() / 86400, 1),
        "cohorts": cohorts,
        "without_baseline": without,
        "stale_baselines": stale,
        "errors": errors,
    }


# --- markdown -------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _type_text(t: dict[str, float]) -> str:
    return ", ".join(f"{k} {100 * v:.0f}%" for k, v in t.items()) or "-"


def _arr(a: list[int | None] | None) -> str:
    return "-" if a is None else "/".join("-" if x is None else str(x) for x in a)


def _nums(a: list[float | None] | None) -> str:
    """p10/median/p90 of a number field, or what the field held instead."""
    return "no numbers" if a is None else "/".join("-" if x is None else f"{x:g}" for x in a)


_OUTCOME_NAMES = {
    "truncated": "truncated",
    "output:truncated": "cut at the token limit",
    "refusal": "refused",
    "output:refusal": "refused (with output)",
    "content_filter": "filtered",
    "output:content_filter": "filtered (with output)",
    "invalid_json": "invalid JSON",
    "not_an_object": "not an object",
    "no_structured_output": "no structured output",
}


def _outcomes_text(outcomes: dict[str, Any] | None) -> str:
    """``truncated 4.0% (80), refused 0.2% (4) of 2,000 responses``; "" when none."""
    if not outcomes or not outcomes.get("counts"):
        return ""
    shares = outcomes.get("shares") or {}
    parts = [
        f"{_OUTCOME_NAMES.get(k, k)} {100 * float(shares.get(k, 0)):.1f}% ({int(n):,})"
        for k, n in outcomes["counts"].items()
    ]
    return f"{', '.join(parts)} of {int(outcomes.get('responses') or 0):,} responses"


# Control characters shown as their Unicode control pictures (U+2400 + code, U+2421 for DEL): a
# newline in a stored value can then start no line, block or table row of the report.
_CONTROL_PICTURES = {**{c: 0x2400 + c for c in range(0x20)}, 0x7F: 0x2421}
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character: each may be escaped
_IDENTIFIER = re.compile(r"[\w.-]+(?: [\w.-]+)*")
_INERT = re.compile(r"[0-9TZ.:+ -]*")  # numbers and ISO times, printed as they are (values never begin a line)


def _md(value: Any) -> str:
    r"""``value`` as Markdown text that renders as exactly its characters: every ASCII punctuation
    character backslash-escaped (CommonMark allows it for all of them), control characters as
    their pictures. No link, image, HTML, emphasis, heading or table cell can come out of it.
    Numbers and times (digits, ``.:+-``, ``T``, ``Z`` and spaces) stay as they are, readable.

    >>> _md("![x](http://h/x.png) | <b>")
    '\\!\\[x\\]\\(http\\:\\/\\/h\\/x\\.png\\) \\| \\<b\\>'
    """
    text = str(value)
    if _INERT.fullmatch(text):  # a count, a rate or a time: nothing in it can form Markdown mid-line
        return text
    return _PUNCTUATION.sub(r"\\\1", text.translate(_CONTROL_PICTURES))


def _code(value: Any) -> str:
    """``value`` as a code span when it is a plain identifier (letters, digits, ``_.-`` and single
    spaces, nothing a code span or a table cell could take differently), else as ``_md`` text."""
    text = str(value)
    return f"`{text}`" if _IDENTIFIER.fullmatch(text) else (_md(text) or "-")


def _cohort_name(c: dict[str, str]) -> str:
    return f"{c['model']} / {c['prompt_version']} / {c['contract']}"


def _md_cohort(c: dict[str, Any]) -> str:
    return " / ".join(_code(c[k]) for k in ("model", "prompt_version", "contract"))


def _md_counts(counts: dict[str, Any]) -> str:
    return ", ".join(f"{_code(k)} ({_md(n)})" for k, n in counts.items())


def _share(v: Any, digits: int = 1, missing: str = "-") -> str:
    """A share as a percentage; anything that is not a number (a crafted document) as escaped text."""
    if v is None:
        return missing
    if isinstance(v, int | float) and not isinstance(v, bool):
        return f"{100 * v:.{digits}f}" + ("%" if digits else "")
    return _md(v)


def _presence_cell(r: dict[str, Any]) -> str:
    """``100.0% -> 57.0%; per day 72 70 71 30 69 70 71; worst 2026-11-29 30.0% (-42.0 pts)``; what
    came from the document other than numbers (the days) is escaped."""
    b, c = r["presence"]
    text = f"{_share(b, missing='not in the baseline')} -> {_share(c, missing='absent')}"
    daily = r.get("daily") or []
    if daily:
        text += "; per day " + " ".join(_share(d.get("presence"), 0, "·") for d in daily)
    w = r.get("worst_day")
    if w:
        move = w.get("move")
        moved = f"{move:+.1f}" if isinstance(move, int | float) and not isinstance(move, bool) else _md(move)
        text += f"; worst {_md(w.get('day'))} {_share(w.get('presence'))} ({moved} pts)"
    return text


def render_markdown(review: dict[str, Any]) -> str:
    """The review as Markdown; every stored value is escaped text or a code span, every table row
    has its five cells whatever the values hold."""
    out = [
        "# shapewatch weekly review",
        "",
        f"Period {_md(review['since'])} .. {_md(review['until'])} (generated {_md(review['generated_at'])}).",
        "",
    ]
    for entry in review["cohorts"]:
        c = entry["cohort"]
        out += [f"## {_md_cohort(c)}", ""]
        out.append(f"- events in the period: {_md(entry['events'])}")
        if entry["unpinned"]:
            served = _md_counts(entry["served_models"]) or "none recorded"
            out.append(f"- **unpinned model alias**: {_code(c['model'])} has no dated version; served models: {served}")
        elif entry["served_models"]:
            out.append("- served models: " + _md_counts(entry["served_models"]))
        if _outcomes_text(entry.get("outcomes")):
            out.append("- responses without a usable output: " + _md(_outcomes_text(entry.get("outcomes"))))
        k = entry["contracts"]
        if k["window"]:
            out.append(
                "- contract versions: "
                + _md_counts(k["window"])
                + (
                    f"; registered version {_code(k['live'])} checked {_md(k['checked'])} outputs"
                    if k["live"]
                    else "; none registered"
                )
                + "".join(f"; **{_code(ch['version'])} went out {_md(ch['first_seen'])}**" for ch in k["changes"])
            )
            if k["violations"]:
                out.append(
                    "- outputs breaking the contract: "
                    + ", ".join(f"{_code(p)} {_md(n)} ({_pct(n / k['checked'])})" for p, n in k["violations"].items())
                )
        b = entry["baseline"]
        if b is None:
            out.append("- **no baseline**: this cohort is not judged")
        else:
            inherited = (
                ""
                if b["how"] == "own"
                else f" (inherited from {_md_cohort(b['cohort'])}, {_md(str(b['how']).replace('_', ' '))})"
            )
            out.append(
                f"- baseline {_code(b['baseline_id'])}{inherited}: frozen {_md(b['created_at'])} "
                f"({_md(b['age_days'])} days ago) by {_md(b['author'])}: {_md(b['note'])}"
                + (" **(older than the configured age)**" if b["stale"] else "")
            )
        for what in ("fired", "acknowledged", "resolved"):
            items = entry["alerts"][what]
            text = "; ".join(
                f"{_md(a['severity'])} {_md(a['kind'])} on {_code(a['field'])}"
                + (f" = {_code(a['value'])}" if a.get("value") else "")
                for a in items[:10]
            )
            out.append(f"- alerts {what}: {len(items)}" + (f" ({text})" if items else ""))
        cand = entry["candidate"]
        out.append(
            f"- suggested candidate window: {_md(cand['since'])} .. {_md(cand['until'])} "
            f"({_md(cand['samples'])} samples)"
            if cand
            else "- suggested candidate window: none (no clean day with enough samples)"
        )
        if cand and cand.get("differs"):
            out.append(
                "  - freezing it would accept these changes against the current baseline: "
                + _md("; ".join(cand["differs"][:10]))
            )
        elif cand and "differs" in cand:
            out.append("  - it matches the current baseline (no rule would fire)")
        if entry["fields"]:
            out += [
                "",
                "| field (largest change first) | presence (baseline -> week; per day; worst day) "
                "| types (baseline -> week) | new enum values | array p50/p90/p99 (baseline -> week) "
                "| numbers p10/median/p90 (baseline -> week) |",
                "|---|---|---|---|---|---|",
            ]
            for r in entry["fields"]:
                mark = "".join(
                    f" ({_md(m)})" for m in (r["status"], r["declared"] and f"{r['declared']} in the contract") if m
                )
                out.append(
                    # the presence cell holds only numbers and dates this module wrote: no stored value
                    f"| {_code(r['field'])}{mark} | {_presence_cell(r)} "
                    f"| {_md(_type_text(r['types'][0]) if r['types'][0] else 'none filled')} -> "
                    f"{_md(_type_text(r['types'][1]) if r['types'][1] else 'none filled')} "
                    f"| {', '.join(_md(v) for v in r['new_values']) or _md(_values_text(r))} "
                    f"| {_md(_arr(r['arrays'][0]) if r['arrays'][0] else 'not an array')} -> "
                    f"{_md(_arr(r['arrays'][1]) if r['arrays'][1] else 'not an array')} "
                    f"| {_md(_nums(r.get('numbers', [None, None])[0]))} -> {_md(_nums(r.get('numbers', [None, None])[1]))} |"
                )
        out.append("")
    out += ["## Cohorts without a baseline", ""]
    out += [f"- {_md_cohort(w['cohort'])}: {_md(w['events'])} events" for w in review["without_baseline"]] or ["- none"]
    out += ["", f"## Baselines older than {_md(review['max_baseline_age_days'])} days", ""]
    out += [
        f"- {_md_cohort(s['cohort'])}: {_code(s['baseline_id'])}, {_md(s['age_days'])} days"
        for s in review["stale_baselines"]
    ] or ["- none"]
    if review.get("errors"):
        out += ["", "## Cohorts that could not be reviewed", ""]
        out += [f"- {_md_cohort(e['cohort'])}: {_md(e['error'])}" for e in review["errors"]]
    return "\n".join(out) + "\n"


# --- html -----------------------------------------------------------------------------------


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _spark(values: list[int], width: int = 160, height: int = 28) -> str:
    """Daily events as small bars (inline SVG)."""
    if not values:
        return ""
    top = max(values) or 1
    w = width / len(values)
    bars = "".join(
        f'<rect x="{i * w:.1f}" y="{height - v / top * height:.1f}" width="{max(w - 1, 1):.1f}" '
        f'height="{v / top * height:.1f}"/>'
        for i, v in enumerate(values)
    )
    return f'<svg class="spark" width="{width}" height="{height}" role="img" aria-label="daily events">{bars}</svg>'


def _presence_bars(b: float | None, c: float | None) -> str:
    """Baseline (grey) and this week (blue) presence, as two thin bars."""

    def bar(y: int, v: float | None, cls: str) -> str:
        return f'<rect class="{cls}" x="0" y="{y}" width="{100 * (v or 0):.1f}" height="6"/>'

    return (
        f'<svg class="bars" width="100" height="14" role="img" aria-label="presence">'
        f"{bar(0, b, 'base')}{bar(8, c, 'cur')}</svg>"
    )


_CSS = """body{font:14px system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}th{background:#f4f4f4}
.spark rect{fill:#6b8cce}.bars .base{fill:#bbb}.bars .cur{fill:#2f6fdf}.warn{color:#a05a00}.page{color:#b00020}
.tag{display:inline-block;padding:0 6px;border-radius:8px;background:#fde9c9;font-size:12px}code{font-size:13px}
.daily polyline{fill:none;stroke:#2f6fdf;stroke-width:1.5}.daily .level{stroke:#888;stroke-dasharray:4 3}
.daily .dot{fill:#2f6fdf}.daily .worst{fill:#b00020}"""


def _daily_chart(daily: list[dict[str, Any]], base: float | None, width: int = 168, height: int = 34) -> str:
    """Presence per day as a line (a gap where a day had no output), the baseline as a dashed level;
    a point per day, the worst one red. Inline SVG, no script."""
    if not daily:
        return ""
    n = len(daily)
    x = (lambda i: width / 2) if n == 1 else (lambda i: 4 + i * (width - 8) / (n - 1))

    def y(v: float) -> float:
        return 2 + (1 - v) * (height - 4)

    parts = []
    if base is not None:
        parts.append(f'<line class="level" x1="0" x2="{width}" y1="{y(base):.1f}" y2="{y(base):.1f}"/>')
    run: list[str] = []
    for i, d in enumerate(daily):
        if d["presence"] is None:
            if len(run) > 1:
                parts.append(f'<polyline points="{" ".join(run)}"/>')
            run = []
            continue
        run.append(f"{x(i):.1f},{y(d['presence']):.1f}")
    if len(run) > 1:
        parts.append(f'<polyline points="{" ".join(run)}"/>')
    moves = [abs(d["presence"] - base) if base is not None and d["presence"] is not None else -1.0 for d in daily]
    worst = max(range(n), key=lambda i: moves[i]) if base is not None else -1
    for i, d in enumerate(daily):
        if d["presence"] is not None:
            cls = "worst" if i == worst and moves[i] > 0 else "dot"
            parts.append(
                f'<circle class="{cls}" cx="{x(i):.1f}" cy="{y(d["presence"]):.1f}" r="2">'
                f"<title>{_e(d['day'])}: {_pct(d['presence'])}</title></circle>"
            )
    return (
        f'<svg class="daily" width="{width}" height="{height}" role="img" aria-label="presence per day">'
        + "".join(parts)
        + "</svg>"
    )


def _values_text(r: dict[str, Any]) -> str:
    if r["new_values"]:
        return ", ".join(r["new_values"])
    return {"free_text": "withheld (free text)", "other": "not an enum"}.get(r.get("values", "enum"), "none")


def _presence_text(v: float | None, missing: str) -> str:
    return missing if v is None else f"{100 * v:.1f}%"


_TEMPLATES = Path(__file__).resolve().parent / "templates"


def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,  # every stored value is text in the page, never markup
        trim_blocks=True,
        lstrip_blocks=True,
    )
    from markupsafe import Markup as markup

    env.globals.update(
        css=markup(_CSS),
        cohort_name=_cohort_name,
        spark=lambda days: markup(_spark([int(n) for _, n in days])),
        presence_bars=lambda b, c: markup(_presence_bars(b, c)),
        daily_chart=lambda daily, base: markup(_daily_chart(daily, base)),
        presence_text=_presence_text,
        type_text=lambda t: _type_text(t) if t else "none filled",
        arr_text=lambda a: _arr(a) if a is not None else "not an array",
        num_text=_nums,
        outcomes_text=_outcomes_text,
        values_text=_values_text,
        change_text=lambda r: f"{100 * float(r.get('change') or 0):.1f} pts",
        worst_text=lambda w: (
            f"{w.get('day')}: {_presence_text(w.get('presence'), '-')} ({float(w.get('move') or 0):+.1f} pts)"
        ),
    )
    return env


def render_html(review: dict[str, Any]) -> str:
    """The review as one HTML page (templates/review.html.j2): every stored value escaped by the
    template engine, charts as inline SVG, no script."""
    return str(_environment().get_template("review.html.j2").render(review=review))
