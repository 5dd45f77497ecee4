"""Frozen, dated baselines: freezing a window's profile, activation per cohort, history.

A baseline is the profile of one cohort over one chosen window, frozen with
who chose it and why. Its content is a canonical JSON document whose SHA-256
(``hash``) covers everything but the creation time, so the same window frozen
twice with the same note gives the same baseline, and an exported file that
was edited is refused on import. Rows of ``baselines`` are only ever
inserted; nothing in shapewatch updates or deletes one.

Which baseline a cohort is compared against is the latest entry of its
activation history (``baseline_activations``, append-only): ``activate`` a
baseline of its own, ``inherit`` one it names (a rollout with no history of
its own), or ``retire`` (none). A cohort with none is compared against the
active baseline of the previous prompt version of the same model and
contract, if there is one (``resolve_baseline``).

>>> b = freeze_baseline(store, Cohort("m", "p1", "c"), since, until,
...                     author="ana", note="after the v3 rollout")   # doctest: +SKIP
>>> resolve_baseline(store, Cohort("m", "p2", "c")).inherited_from    # doctest: +SKIP
Cohort(model='m', prompt_version='p1', contract='c')
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from shapewatch.collector import (
    PRODUCTION,
    SOURCES,
    FieldError,
    FieldProfile,
    JsonType,
    Limits,
    Store,
    read_profile,
    served_aliases,
    tag_problem,
    withhold_free_text,
)
from shapewatch.collector.adapters import WITH_OUTPUT, OutcomeKind
from shapewatch.collector.store import BASELINES_SCHEMA

from .errors import (
    BaselineError,
    BaselineExportIncomplete,
    BaselineInvalid,
    BaselineNotFound,
    BaselineRefused,
    BaselineTampered,
    BaselineUnreadable,
)

__all__ = [
    "BASELINES_SCHEMA",
    "EARLIEST",
    "LATEST",
    "MAX_DOCUMENT_BYTES",
    "NAME_MAX",
    "Activation",
    "ActivationAction",
    "Baseline",
    "BaselineListing",
    "Cohort",
    "ExportReport",
    "Resolved",
    "activate_baseline",
    "activation_history",
    "active_baseline",
    "baseline_from_document",
    "document_problems",
    "export_baselines",
    "export_documents",
    "export_path",
    "freeze_baseline",
    "get_baseline",
    "import_baseline",
    "import_document",
    "inherit_baseline",
    "is_unpinned",
    "list_baselines",
    "read_document",
    "resolve_baseline",
    "retire_baseline",
    "write_document",
]

FORMAT = 1
#: ingest's default ``max_tag_length``: what an imported document's names are held to
DEFAULT_TAG_LENGTH = Limits().max_tag_length


class Cohort(NamedTuple):
    """One (model, prompt version, contract, source): what shapewatch monitors as a unit.

    The source (production, probe, shadow) is last and defaults to production, so a cohort named
    without one is production's: ``Cohort("m", "p", "c") == Cohort("m", "p", "c", "production")``.
    """

    model: str
    prompt_version: str
    contract: str
    source: str = PRODUCTION

    def __str__(self) -> str:
        names = f"{self.model} / {self.prompt_version} / {self.contract}"
        return names if self.source == PRODUCTION else f"{self.source}: {names}"

    def names(self) -> dict[str, str]:
        """The cohort as a baseline document holds it: without ``source`` for production, so
        that documents frozen before sources were part of the cohort keep their hash."""
        out = self._asdict()
        if self.source == PRODUCTION:
            del out["source"]
        return out


_DATED = re.compile(r"(\d{4}-?\d{2}-?\d{2}|\d{8}|\d{4}$|-\d{4}(-|$)|-\d{3}$|@|:)")


def is_unpinned(model: str) -> bool:
    """True for a floating alias (``gpt-4o``), False for a dated version (``gpt-4o-2024-08-06``).

    A model id is pinned when it carries a date (``-2024-08-06``, ``-20250929``),
    a numeric snapshot suffix (``-0613``, ``-001``) or an explicit version tag
    (``@``, ``:``); anything else may change behind the same name.
    """
    return _DATED.search(model) is None


@dataclass(frozen=True)
class Baseline:
    """A frozen profile of one cohort over one window, and who froze it and why."""

    baseline_id: str
    hash: str
    cohort: Cohort
    since: datetime
    until: datetime
    samples: int
    served_models: dict[str, int]
    contract_versions: dict[str, int]
    author: str
    note: str
    created_at: datetime
    forced: str | None  # the reason given when objections were overridden
    fields: dict[str, FieldProfile]
    # Outputs checked against a registered contract version in the window, and those breaking
    # it per path and JSON Schema keyword (collector.Profile.violations); none before contracts.
    checked: int = 0
    violations: dict[str, dict[str, int]] = field(default_factory=dict)
    # Provider outcomes per kind over the window (truncated, refusal, output:truncated...): the
    # outcome rates are judged against these. None in documents frozen before outcomes were kept:
    # their window's outcomes are read from the store instead.
    outcomes: dict[str, int] | None = None

    @property
    def unpinned(self) -> bool:
        return is_unpinned(self.cohort.model)

    def document(self) -> dict[str, Any]:
        """The canonical JSON document (what is stored, exported and hashed)."""
        return {
            **_content(self),
            "baseline_id": self.baseline_id,
            "hash": self.hash,
            "created_at": _iso(self.created_at),
        }

    def summary(self) -> dict[str, Any]:
        """The listing form: everything but the field profiles."""
        doc = self.document()
        doc.pop("fields")
        doc["fields"] = len(self.fields)
        doc["unpinned"] = self.unpinned
        return doc


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _content(b: Baseline) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "cohort": b.cohort.names(),
        "window": {"since": _iso(b.since), "until": _iso(b.until)},
        "samples": b.samples,
        "served_models": b.served_models,
        "contract_versions": b.contract_versions,
        "author": b.author,
        "note": b.note,
        "forced": b.forced,
        "fields": {p: f.to_json() for p, f in sorted(b.fields.items())},
        # only when something was checked: documents frozen before contracts keep their hash
        **({"contract_checks": {"checked": b.checked, "violations": b.violations}} if b.checked else {}),
        # likewise only when kept: documents frozen before keep their hash
        **({"outcomes": b.outcomes} if b.outcomes is not None else {}),
    }


def _canonical(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def _hash(content: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(content)).hexdigest()


def baseline_from_document(
    doc: dict[str, Any], *, where: str = "baseline", max_tag_length: int | None = DEFAULT_TAG_LENGTH
) -> Baseline:
    """Read a document back, refusing one that breaks the baseline schema or whose content does not match its hash.

    The schema is checked field by field first (``BaselineInvalid`` names every failing field):
    a hash proves only that nobody edited the document after it was hashed, and anyone can
    recompute one, so a value of the wrong type or out of range must be refused on its own.
    ``max_tag_length`` is the tag limit of the ingest that produced the cohort (None: not checked).
    """
    if not isinstance(doc, dict):
        raise BaselineError(f"{where}: not a baseline document (a JSON object is expected)")
    if doc.get("format") != FORMAT:
        raise BaselineError(f"{where}: unknown baseline format {doc.get('format')!r} (expected {FORMAT})")
    problems = document_problems(doc, max_tag_length=max_tag_length)
    if problems:
        raise BaselineInvalid(where, problems)
    # Past the schema check every conversion below is of a value of the right type and range.
    checks = doc.get("contract_checks", {})
    b = Baseline(
        baseline_id=doc["baseline_id"],
        hash=doc["hash"],
        cohort=Cohort(**doc["cohort"]),
        since=_time(doc["window"]["since"]),
        until=_time(doc["window"]["until"]),
        samples=doc["samples"],
        served_models=dict(doc["served_models"]),
        contract_versions=dict(doc["contract_versions"]),
        author=doc["author"],
        note=doc["note"],
        created_at=_time(doc["created_at"]),
        forced=doc["forced"],
        fields={p: FieldProfile.from_json(f) for p, f in doc["fields"].items()},
        checked=checks.get("checked", 0),
        violations={p: dict(by) for p, by in checks.get("violations", {}).items()},
        outcomes=dict(doc["outcomes"]) if "outcomes" in doc else None,
    )
    actual = _hash(_content(b))
    if actual != b.hash or b.baseline_id != actual[:16]:
        raise BaselineTampered(where, b.hash, actual)
    return b


# --- the document schema --------------------------------------------------------------------

#: Times of a baseline (its window, its creation) lie in [EARLIEST, LATEST): the window arithmetic
#: of freezing and evaluating stays inside the years a datetime can hold.
EARLIEST = datetime(1971, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)
_MAX_COUNT = 2**63 - 1  # BIGINT: what the store and the rules can count
_JSON_TYPES = frozenset(t.value for t in JsonType)
_TOP = {
    "format": True,
    "cohort": True,
    "window": True,
    "samples": True,
    "served_models": True,
    "contract_versions": True,
    "author": True,
    "note": True,
    "forced": True,
    "fields": True,
    "contract_checks": False,
    "outcomes": False,
    "baseline_id": True,
    "hash": True,
    "created_at": True,
}  # name -> required
_FIELD = {
    "path": True,
    "scope": True,
    "units": True,
    "present": True,
    "types": True,
    "long_strings": True,
    "values": True,
    "values_overflow": True,
    "array_lengths": False,
    "numbers": False,
    "trues": False,
}
_HEX = re.compile(r"[0-9a-f]+")
MAX_PROBLEMS = 50  # problems of one document listed in full; the rest are counted


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def _pointer(*parts: str) -> str:
    # JSON Pointer (RFC 6901): '~' and '/' inside a key are escaped so the path stays unambiguous;
    # a key longer than 80 characters is cut (marked '...') so that a refusal stays small.
    return "".join("/" + (p if len(p) <= 80 else p[:80] + "...").replace("~", "~0").replace("/", "~1") for p in parts)


def _jtype(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(v), type(v).__name__)


class _Checker:
    """Collects every problem of one document, each at its path."""

    def __init__(self, max_tag_length: int | None) -> None:
        self.max_tag_length = max_tag_length
        self.problems: list[FieldError] = []
        self.unlisted = 0

    def bad(self, path: str, reason: str, code: str = "invalid_value") -> None:
        self.add(FieldError(path, reason, code))

    def add(self, problem: FieldError) -> None:
        # A document of 100,000 broken fields is refused with a reply of bounded size.
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)
        else:
            self.unlisted += 1

    def keys(self, obj: Any, path: str, spec: dict[str, bool]) -> bool:
        """An object with the required keys and no others; False (reported) when it is not one."""
        if not isinstance(obj, dict):
            self.bad(path or "/", f"must be an object, got {_jtype(obj)}", "wrong_type")
            return False
        for k, required in spec.items():
            if required and k not in obj:
                self.bad(f"{path}{_pointer(k)}", "is required", "missing")
        for k in obj:
            if k not in spec:
                self.bad(f"{path}{_pointer(str(k))}", "is not a field of a baseline document", "unknown_field")
        return True

    def count(self, v: Any, path: str) -> None:
        if type(v) is not int:
            self.bad(path, f"must be an integer, got {_jtype(v)}", "wrong_type")
        elif not 0 <= v <= _MAX_COUNT:
            self.bad(path, f"must be between 0 and {_MAX_COUNT}, got {v}", "too_large" if v > 0 else "invalid_value")

    def string(self, v: Any, path: str, *, nullable: bool = False) -> None:
        if not (type(v) is str or (nullable and v is None)):
            self.bad(path, f"must be a string{' or null' if nullable else ''}, got {_jtype(v)}", "wrong_type")
        elif v is not None and "\x00" in v:
            self.bad(path, "must not contain NUL characters")

    def tag(self, v: Any, path: str) -> None:
        problem = tag_problem(v, path=path, max_length=self.max_tag_length or _MAX_COUNT)
        if problem is not None:
            self.add(problem)

    def version(self, v: Any, path: str) -> None:
        if v != "":  # '' counts the outputs that named no contract version
            self.tag(v, path)

    def time(self, v: Any, path: str) -> datetime | None:
        if type(v) is not str:
            self.bad(path, f"must be an ISO 8601 time with a zone, got {_jtype(v)}", "wrong_type")
            return None
        try:
            t = datetime.fromisoformat(v)
        except ValueError:
            self.bad(path, f"{v[:40]!r} is not an ISO 8601 time", "invalid_timestamp")
            return None
        if t.tzinfo is None:
            self.bad(path, f"{v[:40]!r} has no time zone", "invalid_timestamp")
            return None
        try:
            t = t.astimezone(UTC)
        except OverflowError:
            t = LATEST  # a zone offset pushed it past the representable years: out of range below
        if not EARLIEST <= t < LATEST:
            self.bad(
                path,
                f"{v[:40]!r} is out of range: baseline times lie in {_iso(EARLIEST)} .. {_iso(LATEST)}",
                "invalid_timestamp",
            )
            return None
        return t

    def counts(self, obj: Any, path: str, key: Callable[[str, str], None] | None = None) -> None:
        """An object of name -> count; ``key`` checks each name."""
        if not isinstance(obj, dict):
            self.bad(path, f"must be an object, got {_jtype(obj)}", "wrong_type")
            return
        for k, v in obj.items():
            at = f"{path}{_pointer(k)}"
            if key is not None:
                key(k, at)
            self.count(v, at)

    def field(self, f: Any, path: str, name: str) -> None:
        if not self.keys(f, path, _FIELD):
            return
        if "path" in f and f["path"] != name:
            self.bad(f"{path}/path", f"must be the field's own key {name[:80]!r}")
        if "scope" in f:
            self.string(f["scope"], f"{path}/scope", nullable=True)
        for k in ("units", "present", "long_strings", "values_overflow"):
            if k in f:
                self.count(f[k], f"{path}/{k}")
        if "types" in f:
            self.counts(f["types"], f"{path}/types", self._json_type)
        if "values" in f:
            self.counts(f["values"], f"{path}/values")
        if "array_lengths" in f:
            self.counts(f["array_lengths"], f"{path}/array_lengths", self._length)
        if "numbers" in f:
            self.counts(f["numbers"], f"{path}/numbers", self._number)
        if "trues" in f:
            self.count(f["trues"], f"{path}/trues")
            booleans = f.get("types", {}).get("boolean", 0) if isinstance(f.get("types"), dict) else 0
            if type(f["trues"]) is int and type(booleans) is int and f["trues"] > booleans:
                self.bad(f"{path}/trues", f"must be at most the field's booleans ({booleans}), got {f['trues']}")

    def _json_type(self, k: str, path: str) -> None:
        if k not in _JSON_TYPES:
            self.bad(path, f"is not a JSON type (one of {', '.join(sorted(_JSON_TYPES))})")

    def _length(self, k: str, path: str) -> None:
        if not (k.isascii() and k.isdigit() and len(k) <= 18):
            self.bad(path, "an array length must be written as a non-negative integer")

    def _number(self, k: str, path: str) -> None:
        try:
            ok = math.isfinite(float(k))
        except ValueError:
            ok = False
        if not ok or len(k) > 40:
            self.bad(path, "a number bin must be written as a finite number")


def document_problems(doc: Any, *, max_tag_length: int | None = DEFAULT_TAG_LENGTH) -> list[FieldError]:
    """Every way ``doc`` breaks the baseline document schema, each at its path (empty: it follows it).

    Types, ranges (counts are integers from 0; times lie in ``EARLIEST`` .. ``LATEST``), the window's
    order, and the tag rule ingest enforces for the cohort, served model and contract version names
    (``collector.tag_problem``; ``max_tag_length`` None checks all of it but the length).
    """
    c = _Checker(max_tag_length)
    if not c.keys(doc, "", _TOP):
        return c.problems
    if doc.get("format") != FORMAT:
        c.bad("/format", f"must be {FORMAT}, got {doc.get('format')!r}")
    # A missing part is reported once (as required), not again for each of its own fields.
    if "cohort" in doc and c.keys(doc["cohort"], "/cohort", {**dict.fromkeys(Cohort._fields, True), "source": False}):
        for k in Cohort._fields:
            if k == "source":
                if k in doc["cohort"] and doc["cohort"][k] not in SOURCES:
                    c.bad("/cohort/source", f"must be one of {', '.join(sorted(SOURCES))}, got {doc['cohort'][k]!r}")
            elif k in doc["cohort"]:
                c.tag(doc["cohort"][k], f"/cohort/{k}")
    window = doc.get("window")
    if "window" in doc and c.keys(window, "/window", {"since": True, "until": True}):
        since = c.time(window["since"], "/window/since") if "since" in window else None
        until = c.time(window["until"], "/window/until") if "until" in window else None
        if since is not None and until is not None and until <= since:
            c.bad("/window/until", f"must be after /window/since ({window['since']}), got {window['until']}")
    if "created_at" in doc:
        c.time(doc["created_at"], "/created_at")
    if "samples" in doc:
        c.count(doc["samples"], "/samples")
    if "served_models" in doc:
        c.counts(doc["served_models"], "/served_models", c.tag)
    if "contract_versions" in doc:
        c.counts(doc["contract_versions"], "/contract_versions", c.version)
    for k in ("author", "note"):
        if k in doc:
            c.string(doc[k], f"/{k}")
    if "forced" in doc:
        c.string(doc["forced"], "/forced", nullable=True)
    for k, size in (("baseline_id", 16), ("hash", 64)):
        v = doc.get(k)
        if k in doc and not (type(v) is str and len(v) == size and _HEX.fullmatch(v)):
            c.bad(f"/{k}", f"must be {size} lowercase hexadecimal digits, got {_jtype(v)} {str(v)[:80]!r}")
    fields = doc.get("fields", {})
    if not isinstance(fields, dict):
        c.bad("/fields", f"must be an object, got {_jtype(fields)}", "wrong_type")
    else:
        for name, f in fields.items():
            c.field(f, _pointer("fields", name), name)
    if "contract_checks" in doc:
        checks = doc["contract_checks"]
        if c.keys(checks, "/contract_checks", {"checked": True, "violations": True}):
            if "checked" in checks:
                c.count(checks["checked"], "/contract_checks/checked")
            violations = checks.get("violations", {})
            if not isinstance(violations, dict):
                c.bad("/contract_checks/violations", f"must be an object, got {_jtype(violations)}", "wrong_type")
            else:
                for p, by in violations.items():
                    c.counts(by, _pointer("contract_checks", "violations", p))
    if "outcomes" in doc:
        c.counts(doc["outcomes"], "/outcomes", _outcome_kind(c))
    if c.unlisted:
        c.problems.append(FieldError("/", f"and {c.unlisted} more problems, not listed"))
    return c.problems


def _outcome_kind(c: _Checker) -> Callable[[str, str], None]:
    def check(kind: str, path: str) -> None:
        if kind not in _OUTCOME_KINDS:
            c.bad(path, f"{kind[:80]!r} is not an outcome kind ({', '.join(sorted(_OUTCOME_KINDS))})", "invalid_value")

    return check


_OUTCOME_KINDS = frozenset(k.value for k in OutcomeKind) | frozenset(WITH_OUTPUT + k.value for k in OutcomeKind)


# --- freezing -------------------------------------------------------------------------------


def freeze_baseline(
    store: Store,
    cohort: Cohort,
    since: datetime,
    until: datetime,
    *,
    author: str,
    note: str,
    min_samples: int = 200,
    objections: Sequence[str] = (),
    force: str | None = None,
    activate: bool = True,
    now: datetime | None = None,
    keep_values: Callable[[str], bool] | None = None,
) -> Baseline:
    """Freeze the profile of ``cohort`` over ``[since, until)``; make it active unless ``activate`` is False.

    The values of free-text paths are not kept (counted as overflow), except at the paths
    ``keep_values`` names (fields declared an enum, whose rule needs the set).

    ``objections`` are reasons found by the caller (open page alerts in the
    window); together with too few samples they refuse the freeze unless
    ``force`` gives a reason, which is recorded in the baseline. Freezing the
    same content again returns the existing baseline.
    """
    for name, t in (("since", since), ("until", until)):
        # Bucket arithmetic on a time near the end of year 9999 overflows; refuse it by name.
        if t.tzinfo is None:
            raise BaselineError(f"{name} {t.isoformat()} has no time zone")
        if not EARLIEST <= t < LATEST:
            raise BaselineError(
                f"{name} {t.isoformat()} is out of range: a baseline window lies in {_iso(EARLIEST)} .. {_iso(LATEST)}"
            )
    if until <= since:
        raise BaselineError(f"the window is empty: since {_iso(since)} is not before until {_iso(until)}")
    if not note.strip():
        raise BaselineError("a baseline needs a note saying why this window is the reference (--note)")
    cid = _cohort_id(store, cohort)
    if cid is None:
        raise BaselineError(_no_cohort(store, cohort))
    # Where the window's edges fall in hour or day buckets (rollup tiers), the profile holds the
    # buckets that start in the window: the window is aligned to them, and the baseline says so.
    if not store.read_only:
        store.fold_tiers()
    since, until = store.covered_window(cid, since, until)
    profile = read_profile(store, cid, since, until)
    found = list(objections)
    if profile.events < min_samples:
        found.insert(
            0,
            f"cohort {cohort} has {profile.events} samples in {_iso(since)} .. {_iso(until)}, "
            f"fewer than the minimum of {min_samples}",
        )
    if found and not (force and force.strip()):
        raise BaselineRefused(found)
    # The profile holds the buckets that start in the window (minutes, or hours and days where the
    # cohort's rollups are in those tiers); the contract versions are counted over the same buckets.
    versions = store.contract_versions_by_cohort(since, until).get(cid, {})
    outcomes = store.outcomes_by_cohort(since, until).get(cid, {})
    draft = Baseline(
        "",
        "",
        cohort,
        since.astimezone(UTC),
        until.astimezone(UTC),
        profile.events,
        dict(sorted(profile.served_models.items())),
        dict(sorted(versions.items())),
        author,
        note,
        now or datetime.now(UTC),
        force if found else None,
        # Values of free-text paths (ids, names, e-mail addresses) serve no rule and are personal
        # data: a baseline keeps their counts, as overflow, never the values.
        withhold_free_text(profile.fields, keep_values),
        profile.checked,
        profile.violations,
        dict(sorted(outcomes.items())),
    )
    digest = _hash(_content(draft))
    baseline = Baseline(**{**draft.__dict__, "baseline_id": digest[:16], "hash": digest})
    with store.transaction("freezing a baseline") as con:
        _insert(store, con, baseline)
        if activate:
            _record(store, con, cohort, "activate", baseline.baseline_id, baseline.created_at, author, note)
    return get_baseline(store, baseline.baseline_id)


def _no_cohort(store: Store, cohort: Cohort) -> str:
    """Why a freeze found nothing, and the cohorts that do exist for the model (the usual miss:
    a cohort with a contract, frozen without ``--contract``, which means ``default``)."""
    same = [r for r in store.cohorts() if r.model == cohort.model]
    text = f"no events were ever stored for cohort {cohort}"
    if not same:
        return text + f"; no cohort has model {cohort.model!r}"
    listed = "; ".join(f"--prompt-version {r.prompt_version} --contract {r.contract}" for r in same[:20])
    more = f" (and {len(same) - 20} more)" if len(same) > 20 else ""
    hint = (
        f"; give --contract (it is {cohort.contract!r} when left out)"
        if any(r.prompt_version == cohort.prompt_version for r in same)
        else ""
    )
    return f"{text}{hint}. Cohorts of model {cohort.model!r}: {listed}{more}"


def _insert(store: Store, con: Any, b: Baseline) -> bool:
    """Insert if absent (by id), in the transaction ``con``; True when it was new."""
    return store.add_baseline(
        con,
        [
            b.baseline_id,
            b.hash,
            *b.cohort[:3],
            b.since,
            b.until,
            b.samples,
            b.author,
            b.note,
            b.created_at,
            _canonical(b.document()).decode(),
            b.cohort.source,
        ],
    )


def _cohort_id(store: Store, cohort: Cohort) -> int | None:
    return store.cohort_id(*cohort)


# --- reading --------------------------------------------------------------------------------


def get_baseline(store: Store, baseline_id: str) -> Baseline:
    """The baseline with this id (or a unique prefix of it, at least 6 characters)."""
    if len(baseline_id) < 6:
        raise BaselineNotFound(f"{baseline_id!r} (give at least 6 characters of the id)")
    rows = store.baseline_documents(baseline_id, limit=2)
    if not rows:
        raise BaselineNotFound(repr(baseline_id))
    if len(rows) > 1:
        raise BaselineNotFound(f"{baseline_id!r}: the prefix matches several baselines; give more of the id")
    return _verified(rows[0], where=f"stored baseline {baseline_id}")


_VERIFIED: dict[str, Baseline] = {}  # document text -> baseline; frozen documents never change


def _verified(text: str, *, where: str = "stored baseline") -> Baseline:
    # Every evaluation reads each cohort's baseline; parsing and re-hashing a large document
    # each time would cost more than the comparison. The cache key is the whole stored text,
    # so a document edited in the file is verified (and refused) again.
    b = _VERIFIED.get(text)
    if b is None:
        # Stored documents were frozen from what ingest accepted, under whatever tag limit was
        # configured then: every rule but that length holds them.
        b = baseline_from_document(orjson.loads(text), where=where, max_tag_length=None)
        if len(_VERIFIED) >= 256:
            _VERIFIED.pop(next(iter(_VERIFIED)))
        _VERIFIED[text] = b
    return b


class ActivationAction(str, Enum):
    activate = "activate"
    inherit = "inherit"
    retire = "retire"


@dataclass(frozen=True)
class Activation:
    """One entry of a cohort's activation history."""

    cohort: Cohort
    action: ActivationAction
    baseline_id: str | None
    at: datetime
    author: str
    note: str


def activation_history(store: Store, cohort: Cohort | None = None) -> list[Activation]:
    """Every activation, oldest first (of one cohort, or all)."""
    return [
        Activation(Cohort(r[0], r[1], r[2], r[8]), ActivationAction(r[3]), r[4], r[5], r[6], r[7])
        for r in store.baseline_activations(cohort)
    ]


def _current(store: Store) -> dict[Cohort, Activation]:
    return {a.cohort: a for a in activation_history(store)}


def active_baseline(store: Store, cohort: Cohort) -> Baseline | None:
    """The cohort's own active baseline (not an inherited one), or None."""
    act = _current(store).get(cohort)
    if act is None or act.action is not ActivationAction.activate or act.baseline_id is None:
        return None
    return get_baseline(store, act.baseline_id)


@dataclass(frozen=True)
class Resolved:
    """What a cohort is compared against, and how that was decided."""

    baseline: Baseline
    how: str  # "own", "parent" (named with inherit), "previous_prompt_version" or "served_alias"

    @property
    def inherited_from(self) -> Cohort | None:
        return None if self.how == "own" else self.baseline.cohort


def resolve_baseline(
    store: Store,
    cohort: Cohort,
    *,
    current: dict[Cohort, Activation] | None = None,
    first_seen: dict[Cohort, datetime] | None = None,
    aliases: dict[tuple[str, str, str, str], list[tuple[str, str, str, str]]] | None = None,
) -> Resolved | None:
    """The baseline ``cohort`` is compared against: its own, a named parent's, the previous prompt
    version's (same model and contract, the latest first seen before it that has an active baseline),
    or, for the cohort of a model that answered under an alias (a served cohort), the baseline the
    alias's cohort resolves to (the alias it answered most for first): a new snapshot behind an alias
    is judged against what the alias was frozen on.
    A cohort whose baseline was retired is compared against nothing: retiring is a decision.

    ``current``, ``first_seen`` and ``aliases`` (``collector.served_aliases``) may be passed in when
    resolving many cohorts at once.
    """
    current = _current(store) if current is None else current
    found = _resolve(store, cohort, current, first_seen)
    if found is not None or cohort in current:
        return found  # an activation of its own (or a retirement) is never overridden
    for alias in (served_aliases(store) if aliases is None else aliases).get(cohort, []):
        via = _resolve(store, Cohort(*alias), current, first_seen)
        if via is not None:
            return Resolved(via.baseline, "served_alias")
    return None


def _resolve(
    store: Store, cohort: Cohort, current: dict[Cohort, Activation], first_seen: dict[Cohort, datetime] | None
) -> Resolved | None:
    act = current.get(cohort)
    if act is not None and act.action is ActivationAction.retire:
        return None
    if act is not None and act.baseline_id is not None:
        if act.action is ActivationAction.activate:
            return Resolved(get_baseline(store, act.baseline_id), "own")
        if act.action is ActivationAction.inherit:
            return Resolved(get_baseline(store, act.baseline_id), "parent")
    if first_seen is None:
        first_seen = {Cohort(r.model, r.prompt_version, r.contract, r.source): r.first_seen for r in store.cohorts()}
    mine = first_seen.get(cohort)
    if mine is None:
        return None
    # Only cohorts with an active baseline can be inherited from: look among those (a few),
    # never through every cohort (with 10,000 cohorts that was 10,000 x 10,000 comparisons).
    earlier = sorted(
        (
            (t, prev, pa.baseline_id)
            for prev, pa in current.items()
            if pa.action is ActivationAction.activate
            and pa.baseline_id is not None
            and prev.model == cohort.model
            and prev.contract == cohort.contract
            and prev.source == cohort.source
            and prev != cohort
            and (t := first_seen.get(prev)) is not None
            and t < mine
        ),
        reverse=True,
    )
    if earlier:
        return Resolved(get_baseline(store, earlier[0][2]), "previous_prompt_version")
    return None


@dataclass(frozen=True)
class BaselineListing:
    baseline: Baseline
    active: bool  # the active baseline of its own cohort


def list_baselines(store: Store, cohort: Cohort | None = None) -> list[BaselineListing]:
    """Every baseline (of one cohort, or all), newest first, with whether it is active."""
    current = _current(store)
    active = {a.baseline_id for a in current.values() if a.action is ActivationAction.activate}
    out = []
    for doc in store.baseline_document_list(cohort):
        b = _verified(doc)
        out.append(BaselineListing(b, b.baseline_id in active))
    return out


# --- activation -----------------------------------------------------------------------------


def _record(
    store: Store,
    con: Any,
    cohort: Cohort,
    action: str,
    baseline_id: str | None,
    at: datetime,
    author: str,
    note: str,
) -> None:
    store.add_baseline_activation(con, [*cohort[:3], action, baseline_id, at, author, note, cohort.source])


def activate_baseline(
    store: Store, baseline_id: str, *, author: str, note: str = "", now: datetime | None = None
) -> Baseline:
    """Make a baseline the active one of its own cohort (the previous one stays in history)."""
    b = get_baseline(store, baseline_id)
    with store.transaction("activating a baseline") as con:
        _record(store, con, b.cohort, "activate", b.baseline_id, now or datetime.now(UTC), author, note)
    return b


def inherit_baseline(
    store: Store, cohort: Cohort, parent_id: str, *, author: str, note: str = "", now: datetime | None = None
) -> Baseline:
    """Compare ``cohort`` (a rollout with no history of its own) against another cohort's baseline."""
    b = get_baseline(store, parent_id)
    with store.transaction("naming a parent baseline") as con:
        _record(store, con, cohort, "inherit", b.baseline_id, now or datetime.now(UTC), author, note)
    return b


def retire_baseline(store: Store, cohort: Cohort, *, author: str, note: str = "", now: datetime | None = None) -> None:
    """Stop comparing ``cohort`` against its baseline (history keeps it)."""
    if cohort not in _current(store):
        raise BaselineNotFound(f"active for cohort {cohort}")
    with store.transaction("retiring a baseline") as con:
        _record(store, con, cohort, "retire", None, now or datetime.now(UTC), author, note)


# --- export and import ----------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
#: NAME_MAX of Linux and macOS file systems: no path part may be longer, in bytes.
NAME_MAX = 255
#: The largest file ``read_document`` reads (an export of a cohort with thousands of fields is
#: a few MiB); a larger one is refused unread.
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
_SUFFIX = 24  # hex digits of SHA-256 that keep shortened names apart


def _component(s: str) -> str:
    # Model ids and versions become directory names: anything outside a safe set is
    # percent-escaped, so "a/b" or ".." can never leave the export directory.
    out = _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), s)
    out = out if out not in ("", ".", "..") else out.replace(".", "%2E") or "%00"
    if len(out) <= NAME_MAX:  # ASCII only: characters are bytes
        return out
    # Too long for a directory name: a readable prefix and a hash of the whole id. '~' never
    # appears in an escaped name (it is escaped itself), so a shortened name never equals
    # the name of another id that fits; two shortened names differ by their hash.
    prefix = out[: NAME_MAX - 1 - _SUFFIX]
    prefix = prefix[: prefix.rfind("%")] if "%" in prefix[-2:] else prefix  # no half escape
    return f"{prefix}~{hashlib.sha256(s.encode()).hexdigest()[:_SUFFIX]}"


def export_path(out_dir: Path, b: Baseline) -> Path:
    """Where ``b`` is exported under ``out_dir``: ``<model>/<prompt_version>/<contract>/<date>-<id>.json``.

    Each part is escaped to a safe file name; one longer than ``NAME_MAX`` bytes is shortened
    to a readable prefix and a hash suffix, the same every time.
    """
    return (
        out_dir
        / _component(b.cohort.model)
        / _component(b.cohort.prompt_version)
        / _component(b.cohort.contract)
        / f"{b.until.astimezone(UTC):%Y-%m-%d}-{b.baseline_id}.json"
    )


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote, and what it could not write (path and reason), in listing order.

    >>> report = export_documents(out_dir, baselines)             # doctest: +SKIP
    >>> report.ok, len(report.written), report.failed              # doctest: +SKIP
    (True, 6, ())
    """

    written: tuple[Path, ...]
    failed: tuple[tuple[Path, str], ...]

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {
            "written": [str(p) for p in self.written],
            "failed": [{"path": str(p), "reason": why} for p, why in self.failed],
        }


def export_documents(out_dir: Path, baselines: Sequence[Baseline]) -> ExportReport:
    """Write each baseline under ``out_dir`` (``export_path``); one that cannot be written is
    reported with its reason and the others are still written."""
    written: list[Path] = []
    failed: list[tuple[Path, str]] = []
    for b in baselines:
        path = export_path(out_dir, b)
        try:
            write_document(path, b)
        except OSError as exc:
            failed.append((path, exc.strerror or str(exc)))
        else:
            written.append(path)
    return ExportReport(tuple(written), tuple(failed))


def export_baselines(store: Store, out_dir: Path, cohort: Cohort | None = None) -> list[Path]:
    """Write every baseline as a canonical JSON file (sorted keys, two-space indent); returns the paths.

    Raises ``BaselineExportIncomplete`` after writing every other baseline when some could not be written.
    """
    report = export_documents(out_dir, [listing.baseline for listing in list_baselines(store, cohort)])
    if not report.ok:
        raise BaselineExportIncomplete(report.written, report.failed)
    return list(report.written)


def write_document(path: Path, b: Baseline) -> None:
    """Write one baseline as canonical JSON (sorted keys, two-space indent, final newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(b.document(), option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n")


_KINDS = [
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
]


def _not_regular(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file; only exported baseline files are imported"


def read_document(path: Path, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> Any:
    """The JSON of one exported baseline file; ``BaselineUnreadable`` for anything but a regular
    file of at most ``max_bytes`` (a FIFO would block, a device read forever), ``BaselineError``
    for a file that is not JSON."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer. The type is judged on the
        # opened descriptor (fstat), so a path swapped between a check and the open cannot pass.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise BaselineUnreadable(path, f"cannot open ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        why = _not_regular(st.st_mode)
        if why is not None:
            raise BaselineUnreadable(path, why)
        if st.st_size > max_bytes:
            raise BaselineUnreadable(path, f"is {st.st_size} bytes; the limit is {max_bytes}")
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # grew while being read
                raise BaselineUnreadable(path, f"is more than {max_bytes} bytes; the limit is {max_bytes}")
    except OSError as exc:
        raise BaselineUnreadable(path, f"cannot read ({exc.strerror})") from exc
    finally:
        os.close(fd)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise BaselineError(f"{path}: cannot read a JSON document ({exc})") from exc


def import_baseline(
    store: Store, path: Path, *, max_bytes: int = MAX_DOCUMENT_BYTES, max_tag_length: int = DEFAULT_TAG_LENGTH
) -> tuple[Baseline, bool]:
    """Import one exported file; returns (baseline, whether it was new). The same file twice is a no-op."""
    return import_document(
        store, read_document(path, max_bytes=max_bytes), where=str(path), max_tag_length=max_tag_length
    )


def import_document(
    store: Store, doc: Any, *, where: str = "baseline document", max_tag_length: int = DEFAULT_TAG_LENGTH
) -> tuple[Baseline, bool]:
    """Store an exported document as it is; returns (baseline, whether it was new).

    Refused when it breaks the document schema (``BaselineInvalid``, every failing field named)
    or its content does not match its hash; a no-op when already stored.
    """
    b = baseline_from_document(doc, where=where, max_tag_length=max_tag_length)
    with store.transaction("importing a baseline") as con:
        new = _insert(store, con, b)
    return b, new
