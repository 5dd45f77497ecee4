"""Operations on baselines, alerts and cohorts, as JSON-ready values: one code path for all callers.

The HTTP API calls these with the service's store; the CLI calls them
directly with ``--db`` and through the HTTP API with ``--url``, so both give
the same answers and the same errors. Freezing is composed here because it
needs judgement the baselines package must not know about: a window holding
unresolved page alerts is not a reference anyone should choose by accident.

>>> freeze(store, config, model="m", prompt_version="p", contract="c", since=t0, until=t1,
...        author="ana", note="weekly review")                       # doctest: +SKIP
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from shapewatch.baselines import (
    BaselineError,
    Cohort,
    activate_baseline,
    activation_history,
    freeze_baseline,
    get_baseline,
    inherit_baseline,
    is_unpinned,
    list_baselines,
    resolve_baseline,
    retire_baseline,
)
from shapewatch.baselines import (
    import_document as store_document,
)
from shapewatch.collector import (
    PRODUCTION,
    FieldProfile,
    RedactPatterns,
    Store,
    contract_changes,
    holds_free_text,
    mask_output,
    read_profile,
    read_step_profiles,
    served_aliases,
)
from shapewatch.collector.adapters import WITH_OUTPUT

from .alerts import AlertBook, AlertState
from .config import AnalyzerConfig, EnumMode, Severity
from .errors import AlertNotFound, SilenceNotFound
from .outcome_rates import OUTCOME_KINDS, responses

__all__ = [
    "COHORTS_WINDOW",
    "MAX_SERIES_POINTS",
    "MAX_USAGE_POINTS",
    "acknowledge",
    "activate",
    "alert",
    "alerts",
    "cohort_fields",
    "cohorts",
    "contract_diff",
    "contract_usage",
    "events",
    "expire_silence",
    "field_series",
    "freeze",
    "import_document",
    "inherit",
    "list_all",
    "retire",
    "served_model_changes",
    "show",
    "silence",
    "silences",
]


#: The traffic window of ``cohorts`` when none is given.
COHORTS_WINDOW = timedelta(days=7)
#: The most steps of a field's series: each step is a window profile read on its own.
MAX_SERIES_POINTS = 500


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _open_page_alerts(store: Store, cohort: Cohort, since: datetime, until: datetime, window: timedelta) -> list[str]:
    # An alert first seen at T judged [T - window, T): its change lies in the data from there on.
    rows = store.open_page_alerts(cohort, window, until)
    return [f"{kind} on {field}{' = ' + repr(v) if v else ''} since {_iso(t)}" for field, kind, v, t in rows]


def freeze(
    store: Store,
    config: AnalyzerConfig,
    *,
    model: str,
    prompt_version: str,
    contract: str,
    since: datetime,
    until: datetime,
    author: str,
    note: str,
    force: str | None = None,
    activate: bool = True,
    now: datetime | None = None,
    source: str = PRODUCTION,
) -> dict[str, Any]:
    """Freeze a cohort's window as a baseline (refused over open page alerts or too few samples)."""
    cohort = Cohort(model, prompt_version, contract, source)
    open_pages = _open_page_alerts(store, cohort, since, until, config.window)
    objections = (
        [f"the window holds {len(open_pages)} unresolved page alert(s): " + "; ".join(open_pages[:5])]
        if open_pages
        else []
    )

    def declared_enum(path: str) -> bool:
        # an operator's enum keeps its values in the baseline whatever they look like: its rule needs the set
        rules = config.rules_for(contract, path)
        return rules.mode is EnumMode.enum or rules.allowed is not None

    b = freeze_baseline(
        store,
        cohort,
        since,
        until,
        keep_values=declared_enum,
        author=author,
        note=note,
        min_samples=config.defaults.min_samples,
        objections=objections,
        force=force,
        activate=activate,
        now=now,
    )
    active = next(
        (item.active for item in list_baselines(store, cohort) if item.baseline.baseline_id == b.baseline_id), False
    )
    return {**b.summary(), "active": active}


def list_all(store: Store, cohort: Cohort | None = None) -> list[dict[str, Any]]:
    return [{**item.baseline.summary(), "active": item.active} for item in list_baselines(store, cohort)]


def show(store: Store, baseline_id: str) -> dict[str, Any]:
    return get_baseline(store, baseline_id).document()


def activate(store: Store, baseline_id: str, *, author: str, note: str = "") -> dict[str, Any]:
    return {**activate_baseline(store, baseline_id, author=author, note=note).summary(), "active": True}


def inherit(store: Store, cohort: Cohort, parent_id: str, *, author: str, note: str = "") -> dict[str, Any]:
    b = inherit_baseline(store, cohort, parent_id, author=author, note=note)
    return {"cohort": cohort._asdict(), "parent": b.summary()}


def retire(store: Store, cohort: Cohort, *, author: str, note: str = "") -> dict[str, Any]:
    retire_baseline(store, cohort, author=author, note=note)
    return {"cohort": cohort._asdict(), "retired": True}


def import_document(store: Store, doc: Any, *, where: str = "request body") -> dict[str, Any]:
    """Import one exported baseline document: refused when tampered, a no-op when already stored."""
    b, new = store_document(store, doc, where=where)
    return {"baseline_id": b.baseline_id, "hash": b.hash, "imported": new}


def alerts(
    store: Store,
    *,
    state: str | None = None,
    severity: str | None = None,
    model: str | None = None,
    prompt_version: str | None = None,
    contract: str | None = None,
    kind: str | None = None,
    now: datetime | None = None,
    source: str | None = None,
) -> list[dict[str, Any]]:
    """Alerts (page first), filtered; ``state`` may be ``open`` for pending and firing."""
    now = now or datetime.now(UTC)
    ids = {Cohort(r.model, r.prompt_version, r.contract, r.source): r.cohort_id for r in store.cohorts()}
    found = AlertBook(store).alerts(
        state=AlertState(state) if state and state != "open" else None,
        severity=Severity(severity) if severity else None,
        now=now,
    )
    out = []
    for a in found:
        if state == "open" and a.state is AlertState.resolved:
            continue
        if (
            (model and a.cohort.model != model)
            or (prompt_version and a.cohort.prompt_version != prompt_version)
            or (contract and a.cohort.contract != contract)
            or (source and a.cohort.source != source)
            or (kind and a.kind.value != kind)
        ):
            continue
        out.append({**a.to_json(), "cohort_id": ids.get(a.cohort)})
    return out


def _cohort_id_of(store: Store, cohort: Cohort) -> int | None:
    return store.cohort_id(*cohort)


def alert(store: Store, fingerprint: str) -> dict[str, Any]:
    """One alert (silences filled in) with its history."""
    book = AlertBook(store)
    for a in book.alerts(now=datetime.now(UTC)):
        if a.fingerprint == fingerprint:
            return {**a.to_json(), "cohort_id": _cohort_id_of(store, a.cohort), "history": book.history(fingerprint)}
    raise AlertNotFound(fingerprint)


def acknowledge(store: Store, fingerprint: str, *, by: str) -> dict[str, Any]:
    a = AlertBook(store).acknowledge(fingerprint, by=by, now=datetime.now(UTC))
    return {**a.to_json(), "cohort_id": _cohort_id_of(store, a.cohort)}


def _silence_json(s: Any) -> dict[str, Any]:
    return {
        "silence_id": s.silence_id,
        "starts_at": _iso(s.starts_at),
        "ends_at": _iso(s.ends_at),
        "author": s.author,
        "reason": s.reason,
        "match": {
            k: v
            for k, v in (
                ("fingerprint", s.fingerprint),
                ("model", s.model),
                ("prompt_version", s.prompt_version),
                ("contract", s.contract),
                ("field", s.field),
                ("kind", s.kind),
            )
            if v is not None
        },
    }


def silence(store: Store, *, duration: timedelta, author: str, reason: str, **match: str | None) -> dict[str, Any]:
    now = datetime.now(UTC)
    return _silence_json(
        AlertBook(store).silence(starts_at=now, ends_at=now + duration, author=author, reason=reason, **match)
    )


def expire_silence(store: Store, silence_id: int) -> dict[str, Any]:
    """End a silence now (the alerts it held are notified again from the next evaluation)."""
    if not 0 < silence_id < 2**63 or not store.end_silence(silence_id, datetime.now(UTC)):
        raise SilenceNotFound(silence_id)
    found = next((s for s in AlertBook(store).silences(now=None) if s.silence_id == silence_id), None)
    if found is None:
        raise SilenceNotFound(silence_id)
    return _silence_json(found)


def silences(store: Store, *, active: bool = True) -> list[dict[str, Any]]:
    """Silences, oldest first; with ``active`` only those not yet ended."""
    return [_silence_json(s) for s in AlertBook(store).silences(now=datetime.now(UTC) if active else None)]


def cohorts(
    store: Store, *, since: datetime | None = None, until: datetime | None = None, source: str | None = None
) -> list[dict[str, Any]]:
    """Every cohort (of one source, or all: production first within a model, prompt version and
    contract) with its traffic in the window, baseline, unpinned marker, alerts and served models."""
    until = until or datetime.now(UTC)
    since = since or until - COHORTS_WINDOW
    store.flush_rollups()
    traffic = store.events_by_cohort(since, until)
    served = store.served_by_cohort(since, until)
    contracts = store.contract_versions_by_cohort(since, until)  # contract version ('' none) -> outputs
    outcomes = store.outcomes_by_cohort(since, until)
    counts = store.firing_alert_counts()
    last_events, totals = store.last_events(), store.events_total()  # from the rollups: a restart keeps them
    current = {a.cohort: a for a in activation_history(store)}
    rows = store.cohorts()
    first_seen = {Cohort(r.model, r.prompt_version, r.contract, r.source): r.first_seen for r in rows}
    aliases = served_aliases(store)
    out = []
    for cid, m, p, c, first, src in rows:
        if source is not None and src != source:
            continue
        cohort = Cohort(m, p, c, src)
        resolved = resolve_baseline(store, cohort, current=current, first_seen=first_seen, aliases=aliases)
        baseline = None
        if resolved is not None:
            b = resolved.baseline
            baseline = {
                "baseline_id": b.baseline_id,
                "how": resolved.how,
                "cohort": b.cohort._asdict(),
                "created_at": _iso(b.created_at),
                "author": b.author,
                "note": b.note,
                "age_days": round((datetime.now(UTC) - b.created_at).total_seconds() / 86400, 2),
                "window": {"since": _iso(b.since), "until": _iso(b.until)},
                "samples": b.samples,
            }
        out.append(
            {
                "cohort_id": int(cid),
                "cohort": cohort._asdict(),
                "first_seen": _iso(first),
                "events": traffic.get(int(cid), 0),
                "unpinned": is_unpinned(cohort.model),
                "served_models": served.get(int(cid), {}),
                "baseline": baseline,
                # a served cohort: the aliases (requested model ids) this model answered for
                "answered_for": [a[0] for a in aliases.get(cohort, [])],
                # contract versions the outputs were tagged with ('' : none), most outputs first
                "contract_versions": contracts.get(int(cid), {}),
                # responses that never reached a parser: truncated, refused, filtered, invalid JSON
                "provider_outcomes": outcomes.get(int(cid), {}),
                # the shares the outcome-rate rules judge, of responses (outputs + outcomes without one)
                "outcome_rates": outcome_rates(outcomes.get(int(cid), {}), traffic.get(int(cid), 0)),
                "alerts_firing": counts.get(cohort, {}),
                # the newest rollup bucket with an event (to the bucket: a minute for recent data)
                "last_event_at": _iso(last_events[int(cid)]) if int(cid) in last_events else None,
                "events_total": totals.get(int(cid), 0),
            }
        )
    return out


def outcome_rates(outcomes: dict[str, int], outputs: int) -> dict[str, float]:
    """truncation_rate, refusal_rate and invalid_output_rate of a cohort's responses, as the
    outcome-rate rules count them; {} without responses."""
    total = responses(outputs, outcomes)
    if not total:
        return {}
    return {
        kind.value: round(sum(outcomes.get(k, 0) + outcomes.get(WITH_OUTPUT + k, 0) for k in counted) / total, 6)
        for kind, counted in OUTCOME_KINDS.items()
    }


def incidents(store: Store, *, open_only: bool = False, limit: int = 100) -> list[dict[str, Any]]:
    """Incidents, newest first: the page alerts each gathered (analysis/incidents.py)."""
    import orjson

    return [
        {
            "incident_id": iid,
            "group": orjson.loads(key),
            "opened_at": _iso(opened),
            "resolved_at": _iso(resolved) if resolved is not None else None,
            "summary": summary,
            "fingerprints": [f for f in fps if f is not None],
        }
        for iid, key, opened, resolved, summary, fps in store.incident_rows(open_only=open_only, limit=limit)
    ]


def cohort_fields(store: Store, cohort_id: int, *, since: datetime, until: datetime) -> dict[str, Any]:
    """The window profile of one cohort, field by field."""
    p = read_profile(store, cohort_id, since, until)
    redact = _redact(store)
    withheld = {path for path, f in p.fields.items() if holds_free_text(f) or redact.matches(path)}
    return {
        "cohort_id": cohort_id,
        "cohort": {"model": p.model, "prompt_version": p.prompt_version, "contract": p.contract, "source": p.source},
        "since": _iso(since),
        "until": _iso(until),
        "events": p.events,
        "served_models": p.served_models,
        "fields": [
            {
                **f.to_json(),
                # free text or redacted: the values are personal data and serve no rule
                **({"values": {}, "values_withheld": True} if f.path in withheld else {"values_withheld": False}),
                "presence_rate": round(f.presence_rate, 6),
                "filled": f.filled,
                "array_p50": f.array_percentile(0.5),
                "array_p90": f.array_percentile(0.9),
                "array_p99": f.array_percentile(0.99),
                "number_p50": f.number_percentile(0.5),
                "number_p90": f.number_percentile(0.9),
                "number_p99": f.number_percentile(0.99),
            }
            for f in p.fields.values()
        ],
    }


def served_model_changes(store: Store) -> list[dict[str, Any]]:
    return [
        {
            "cohort": {"model": m, "prompt_version": p, "contract": c},
            "previous": prev,
            "current": cur,
            "detected_at": _iso(t),
        }
        for m, p, c, prev, cur, t in store.served_model_changes()
    ]


def _number_levels(f: FieldProfile | None) -> dict[str, float | None] | None:
    """p10, median and p90 of a field's numbers (from its histogram: exact for integers up to 100,
    within 1% otherwise), as the value_shift rule reads them; None when it holds no number."""
    if f is None or not f.numbers:
        return None
    return {"p10": f.number_percentile(0.1), "p50": f.number_percentile(0.5), "p90": f.number_percentile(0.9)}


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _redact(store: Store) -> RedactPatterns:
    rollup = getattr(store, "rollup", None)
    return RedactPatterns(tuple(getattr(rollup, "redact_paths", ()) or ()))


def _values_kind(
    path: str, base: FieldProfile | None, period: FieldProfile | None, enum: bool | None, redact: RedactPatterns
) -> str:
    """What the values of a field are, for showing them: ``enum`` (shown, with the unknown share),
    ``free_text`` (withheld: ids, names, addresses; or a redacted path), ``numeric`` (a number
    field: its values are not a set, whatever strings it gets) or ``none`` (no strings at all)."""
    if redact.matches(path) or any(f is not None and holds_free_text(f) for f in (base, period)):
        return "free_text"
    ref = base if base is not None else period
    if ref is None:
        return "none"
    numbers = ref.types.get("integer", 0) + ref.types.get("number", 0)
    strings = ref.types.get("string", 0)
    if numbers and numbers >= strings:
        return "numeric"
    if not strings and not (period and period.types.get("string")):
        return "none"
    if base is not None:
        # a baseline without the values of its strings withheld them as free text when frozen
        return "enum" if enum and base.values else "free_text" if strings and not base.values else "enum"
    return "enum"


def field_series(
    store: Store,
    config: AnalyzerConfig,
    cohort_id: int,
    path: str,
    *,
    since: datetime,
    until: datetime,
    points: int = 24,
) -> dict[str, Any]:
    """One field of one cohort over time, in ``points`` equal steps: presence, type shares, values
    and the unknown share against the cohort's baseline, array-size percentiles; with the baseline's
    levels, for charts against it. Each step is a window profile (a sum of buckets).

    Values and the unknown share are given only for a field whose values are a set (``values_kind``
    ``enum``): never for free text (ids, names, e-mail addresses, or a ``redact_paths`` path),
    whose values are personal data, nor for a number field. The unknown share counts the values
    outside the baseline's set over every filled value of the field, whatever its type."""
    from .rules import enum_like

    if not 1 <= points <= MAX_SERIES_POINTS:
        raise BaselineError(f"points must be between 1 and {MAX_SERIES_POINTS}")
    row = store.cohort(cohort_id)
    if row is None:
        raise LookupError(f"no cohort {cohort_id}")
    cohort = Cohort(row.model, row.prompt_version, row.contract, row.source)
    resolved = resolve_baseline(store, cohort)
    base = resolved.baseline.fields.get(path) if resolved else None
    rules = config.rules_for(cohort.contract, path)
    known = set(base.values) if base else set()
    step = (until - since) / points
    edges = [since + step * i for i in range(points + 1)]
    # one grouped read of the path over every step (each step what read_profile gives for it)
    steps: list[tuple[datetime, datetime, FieldProfile | None, Any]] = [
        (lo, hi, profile.fields.get(path), profile)
        for (lo, hi), profile in zip(
            itertools.pairwise(edges), read_step_profiles(store, cohort_id, edges, [path]), strict=True
        )
    ]
    period = _period_field(path, [f for _, _, f, _ in steps if f is not None])
    kind = _values_kind(path, base, period, enum_like(base, rules) if base else None, _redact(store))
    shown = kind == "enum"
    series = []
    for lo, hi, f, profile in steps:
        broken = max((profile.violations.get(path) or {}).values(), default=0)
        unknown = (
            sum(n for v, n in f.values.items() if v not in known) + f.values_overflow + f.long_strings
            if f and base
            else 0
        )
        series.append(
            {
                "since": _iso(lo),
                "until": _iso(hi),
                "units": f.units if f else 0,
                "presence_rate": round(f.presence_rate, 6) if f else None,
                "types": {t: round(f.type_share(t), 6) for t in sorted(f.types)} if f else {},
                "values": dict(sorted(f.values.items(), key=lambda kv: (-kv[1], kv[0]))[:20]) if f and shown else {},
                # over every filled value: a number field's strings are not 100% unknown when 28% are strings
                "unknown_share": round(unknown / f.filled, 6) if f and f.filled and base and shown else None,
                # outputs breaking their registered contract at this path, of those checked
                "violation_rate": round(broken / profile.checked, 6) if profile.checked else None,
                "array": (
                    {
                        "p50": f.array_percentile(0.5),
                        "p90": f.array_percentile(0.9),
                        "p99": f.array_percentile(0.99),
                        "empty_share": round(f.empty_array_share, 6),
                    }
                    if f and f.array_lengths
                    else None
                ),
                "numbers": _number_levels(f),
                "true_share": _rounded(f.true_share) if f else None,
            }
        )
    baseline = None
    if resolved is not None:
        b = resolved.baseline
        baseline = {"baseline_id": b.baseline_id, "how": resolved.how, "present": base is not None}
        if base is not None:
            baseline |= {
                "presence_rate": round(base.presence_rate, 6),
                "tolerance": rules.tolerance,
                "types": {t: round(base.type_share(t), 6) for t in sorted(base.types)},
                "values": dict(sorted(base.values.items(), key=lambda kv: (-kv[1], kv[0]))[:50]) if shown else {},
                "enum_like": enum_like(base, rules),
                "array": (
                    {
                        "p50": base.array_percentile(0.5),
                        "p90": base.array_percentile(0.9),
                        "p99": base.array_percentile(0.99),
                    }
                    if base.array_lengths
                    else None
                ),
                "numbers": _number_levels(base),
                "true_share": _rounded(base.true_share),
            }
    # a contract version first seen inside the range: a marker on the charts
    changes = [
        {"version": c["version"], "at": _iso(c["first_seen"])}
        for c in contract_changes(store, cohort_id, since, until).get(cohort_id, [])
    ]
    return {
        "cohort_id": cohort_id,
        "cohort": cohort._asdict(),
        "field": path,
        "since": _iso(since),
        "until": _iso(until),
        "values_kind": kind,
        "baseline": baseline,
        "series": series,
        "contract_changes": changes,
    }


def _period_field(path: str, parts: list[FieldProfile]) -> FieldProfile | None:
    """The steps' profiles of one path added up (what the whole period held)."""
    if not parts:
        return None
    types: dict[str, int] = {}
    values: dict[str, int] = {}
    for f in parts:
        for t, n in f.types.items():
            types[t] = types.get(t, 0) + n
        for v, n in f.values.items():
            values[v] = values.get(v, 0) + n
    return FieldProfile(
        path,
        parts[0].scope,
        sum(f.units for f in parts),
        sum(f.present for f in parts),
        types,
        sum(f.long_strings for f in parts),
        values,
        sum(f.values_overflow for f in parts),
    )


def events(store: Store, event_ids: list[str]) -> list[dict[str, Any]]:
    """Stored outputs by event id (samples of an alert), with their tags; unknown ids are left out.

    Strings at free-text paths of the cohort's baseline, at ``redact_paths`` paths, and any string
    that looks like an e-mail address read ``[withheld]``: a sample shows the shape, not the person."""
    import orjson

    if not event_ids or len(event_ids) > 100:
        raise BaselineError("give between 1 and 100 event ids")
    redact = _redact(store)
    free: dict[tuple[str, str, str], set[str]] = {}

    def hidden(e: Any) -> set[str]:
        key = (e.model, e.prompt_version, e.contract)
        if key not in free:
            resolved = resolve_baseline(store, Cohort(*key))
            fields = resolved.baseline.fields if resolved else {}
            free[key] = {p for p, f in fields.items() if holds_free_text(f) or (f.types.get("string") and not f.values)}
        return free[key]

    out = []
    for e in store.events_by_id(event_ids):
        paths = hidden(e)
        out.append(
            {
                "event_id": e.event_id,
                "ts": _iso(e.ts),
                "cohort": {"model": e.model, "prompt_version": e.prompt_version, "contract": e.contract},
                "served_model": e.served_model,
                "contract_version": e.contract_version,
                "source": e.source,
                "output": mask_output(orjson.loads(e.output), lambda p, paths=paths: p in paths or redact.matches(p)),
            }
        )
    return out


# --- contracts ------------------------------------------------------------------------------


def register_contract(
    store: Store, contract: str, version: str, document: Any, *, author: str, note: str | None = None
) -> dict[str, Any]:
    """Register ``document`` (a parsed JSON Schema, tool or catalog) as ``contract`` ``version``;
    its summary with ``created`` (False: the same content was registered before)."""
    from shapewatch.collector import register_contract as register

    registered, created = register(store, contract, version, document, author=author, note=note)
    return {**registered.summary(), "created": created}


def list_contracts(store: Store, contract: str | None = None) -> list[dict[str, Any]]:
    """Every registered contract version (of one contract), oldest registration first."""
    from shapewatch.collector import list_contracts as listed

    return [r.summary() for r in listed(store, contract)]


def show_contract(store: Store, contract: str, version: str) -> dict[str, Any]:
    """One registered version with its document."""
    from shapewatch.collector import get_contract

    return get_contract(store, contract, version).to_json()


#: The most steps of a contract's usage series.
MAX_USAGE_POINTS = 500


def contract_diff(store: Store, contract: str, old: str, new: str) -> dict[str, Any]:
    """The classified changes from registered version ``old`` of ``contract`` to ``new`` (what
    ``shapewatch contract diff`` prints for two files), with the verdict: the most serious change."""
    from shapewatch.collector import diff_contracts, diff_verdict, get_contract

    before, after = get_contract(store, contract, old), get_contract(store, contract, new)
    changes = diff_contracts(before.definition, after.definition)
    return {
        "contract": contract,
        "from": old,
        "to": new,
        "verdict": diff_verdict(changes).value,
        "changes": [c.to_json() for c in changes],
    }


def contract_usage(
    store: Store, contract: str, *, since: datetime, until: datetime, points: int = 28
) -> dict[str, Any]:
    """How each version of ``contract`` was used over ``[since, until)`` in ``points`` steps: per
    version, the outputs tagged with it and checked, the share of checked ones breaking it per step,
    whether it is registered, and which cohorts send it (with their outputs). Untagged outputs are
    version ``""``."""
    if not 1 <= points <= MAX_USAGE_POINTS:
        raise BaselineError(f"points must be between 1 and {MAX_USAGE_POINTS}")
    store.flush_rollups()
    registered = [r.version for r in store.contract_versions(contract)]
    cohorts = {r.cohort_id: r for r in store.cohorts() if r.contract == contract}
    step = (until - since) / points
    rows = store.contract_status_steps(list(cohorts), since, until, step.total_seconds())
    per: dict[str, dict[str, Any]] = {}

    def version(v: str) -> dict[str, Any]:
        if v not in per:
            per[v] = {
                "version": v,
                "registered": v in registered,
                "outputs": 0,
                "steps": [{"valid": 0, "invalid": 0, "other": 0} for _ in range(points)],
                "cohorts": {},
            }
        return per[v]

    for v in registered:
        version(v)
    for cid, v, i, status, n in rows:
        if not 0 <= i < points:
            continue
        entry = version(v)
        entry["outputs"] += n
        slot = entry["steps"][i]
        slot[status if status in ("valid", "invalid") else "other"] += n
        entry["cohorts"][cid] = entry["cohorts"].get(cid, 0) + n
    versions = []
    for v in [*registered, *sorted(set(per) - set(registered))]:
        entry = per[v]
        series = []
        for i, slot in enumerate(entry["steps"]):
            checked = slot["valid"] + slot["invalid"]
            series.append(
                {
                    "since": _iso(since + step * i),
                    "until": _iso(since + step * (i + 1)),
                    "outputs": checked + slot["other"],
                    "checked": checked,
                    "invalid": slot["invalid"],
                    "violation_rate": round(slot["invalid"] / checked, 6) if checked else None,
                }
            )
        versions.append(
            {
                "version": v,
                "registered": entry["registered"],
                "outputs": entry["outputs"],
                "series": series,
                "cohorts": [
                    {
                        "cohort_id": cid,
                        "cohort": {
                            "model": cohorts[cid].model,
                            "prompt_version": cohorts[cid].prompt_version,
                            "contract": cohorts[cid].contract,
                        },
                        "outputs": n,
                    }
                    for cid, n in sorted(entry["cohorts"].items(), key=lambda kv: (-kv[1], kv[0]))
                ],
            }
        )
    return {"contract": contract, "since": _iso(since), "until": _iso(until), "versions": versions}
