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
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from collector import FieldProfile, Schema, Store, read_profile, served_aliases

from .errors import BaselineError, BaselineNotFound, BaselineRefused, BaselineTampered

__all__ = ["BASELINES_SCHEMA", "Activation", "ActivationAction", "Baseline", "BaselineListing", "Cohort", "Resolved",
           "activate_baseline", "activation_history", "active_baseline", "baseline_from_document",
           "export_baselines", "export_path", "freeze_baseline", "get_baseline", "import_baseline", "import_document", "inherit_baseline",
           "is_unpinned", "list_baselines", "resolve_baseline", "retire_baseline", "write_document"]

FORMAT = 1

BASELINES_SCHEMA = Schema("baselines", ("""
CREATE TABLE baselines (
    baseline_id VARCHAR PRIMARY KEY, hash VARCHAR NOT NULL UNIQUE,
    model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL,
    since TIMESTAMPTZ NOT NULL, until TIMESTAMPTZ NOT NULL, samples BIGINT NOT NULL,
    author VARCHAR NOT NULL, note VARCHAR NOT NULL, created_at TIMESTAMPTZ NOT NULL,
    document VARCHAR NOT NULL);
-- Append-only: the latest row of a cohort says what it is compared against.
CREATE SEQUENCE baseline_activation_seq START 1;
CREATE TABLE baseline_activations (
    seq BIGINT PRIMARY KEY DEFAULT nextval('baseline_activation_seq'),
    model VARCHAR NOT NULL, prompt_version VARCHAR NOT NULL, contract VARCHAR NOT NULL,
    action VARCHAR NOT NULL, baseline_id VARCHAR, activated_at TIMESTAMPTZ NOT NULL,
    author VARCHAR NOT NULL, note VARCHAR NOT NULL);
""",))


class Cohort(NamedTuple):
    """One (model, prompt version, contract): what shapewatch monitors as a unit."""

    model: str
    prompt_version: str
    contract: str

    def __str__(self) -> str:
        return f"{self.model} / {self.prompt_version} / {self.contract}"


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

    @property
    def unpinned(self) -> bool:
        return is_unpinned(self.cohort.model)

    def document(self) -> dict[str, Any]:
        """The canonical JSON document (what is stored, exported and hashed)."""
        return {**_content(self), "baseline_id": self.baseline_id, "hash": self.hash,
                "created_at": _iso(self.created_at)}

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
        "cohort": b.cohort._asdict(),
        "window": {"since": _iso(b.since), "until": _iso(b.until)},
        "samples": b.samples, "served_models": b.served_models, "contract_versions": b.contract_versions,
        "author": b.author, "note": b.note, "forced": b.forced,
        "fields": {p: f.to_json() for p, f in sorted(b.fields.items())},
        # only when something was checked: documents frozen before contracts keep their hash
        **({"contract_checks": {"checked": b.checked, "violations": b.violations}} if b.checked else {}),
    }


def _canonical(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def _hash(content: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(content)).hexdigest()


def baseline_from_document(doc: dict[str, Any], *, where: str = "baseline") -> Baseline:
    """Read a document back, refusing one whose content does not match its hash."""
    try:
        if doc.get("format") != FORMAT:
            raise BaselineError(f"{where}: unknown baseline format {doc.get('format')!r} (expected {FORMAT})")
        cohort = Cohort(**doc["cohort"])
        b = Baseline(
            baseline_id=str(doc["baseline_id"]), hash=str(doc["hash"]), cohort=cohort,
            since=datetime.fromisoformat(doc["window"]["since"]), until=datetime.fromisoformat(doc["window"]["until"]),
            samples=int(doc["samples"]), served_models={str(k): int(v) for k, v in doc["served_models"].items()},
            contract_versions={str(k): int(v) for k, v in doc["contract_versions"].items()},
            author=str(doc["author"]), note=str(doc["note"]), created_at=datetime.fromisoformat(doc["created_at"]),
            forced=doc.get("forced"),
            fields={str(p): FieldProfile.from_json(f) for p, f in doc["fields"].items()},
            checked=int(doc.get("contract_checks", {}).get("checked", 0)),
            violations={str(p): {str(k): int(n) for k, n in by.items()}
                        for p, by in doc.get("contract_checks", {}).get("violations", {}).items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, BaselineError):
            raise
        raise BaselineError(f"{where}: not a baseline document ({type(exc).__name__}: {exc})") from exc
    actual = _hash(_content(b))
    if actual != b.hash or b.baseline_id != actual[:16]:
        raise BaselineTampered(where, b.hash, actual)
    return b


# --- freezing -------------------------------------------------------------------------------

def freeze_baseline(store: Store, cohort: Cohort, since: datetime, until: datetime, *, author: str, note: str,
                    min_samples: int = 200, objections: Sequence[str] = (), force: str | None = None,
                    activate: bool = True, now: datetime | None = None) -> Baseline:
    """Freeze the profile of ``cohort`` over ``[since, until)``; make it active unless ``activate`` is False.

    ``objections`` are reasons found by the caller (open page alerts in the
    window); together with too few samples they refuse the freeze unless
    ``force`` gives a reason, which is recorded in the baseline. Freezing the
    same content again returns the existing baseline.
    """
    if until <= since:
        raise BaselineError(f"the window is empty: --since {_iso(since)} is not before --until {_iso(until)}")
    if not note.strip():
        raise BaselineError("a baseline needs a note saying why this window is the reference (--note)")
    cid = _cohort_id(store, cohort)
    if cid is None:
        raise BaselineError(f"no events were ever stored for cohort {cohort}")
    profile = read_profile(store, cid, since, until)
    found = list(objections)
    if profile.events < min_samples:
        found.insert(0, f"cohort {cohort} has {profile.events} samples in {_iso(since)} .. {_iso(until)}, "
                        f"fewer than the minimum of {min_samples}")
    if found and not (force and force.strip()):
        raise BaselineRefused(found)
    # The profile holds the buckets that start in the window, i.e. events in [ceil(since), ceil(until))
    # on the bucket grid; count contract versions over exactly those events.
    lo, hi = _bucket_ceil(since, store.bucket_seconds), _bucket_ceil(until, store.bucket_seconds)
    versions = {str(v): int(n) for v, n in store.query(
        """SELECT coalesce(contract_version, ''), count(*) FROM cohort_events
           WHERE cohort_id = ? AND ts >= ? AND ts < ? GROUP BY ALL""", [cid, lo, hi])}
    draft = Baseline("", "", cohort, since.astimezone(UTC), until.astimezone(UTC), profile.events,
                     dict(sorted(profile.served_models.items())), dict(sorted(versions.items())),
                     author, note, now or datetime.now(UTC), force if found else None, profile.fields,
                     profile.checked, profile.violations)
    digest = _hash(_content(draft))
    baseline = Baseline(**{**draft.__dict__, "baseline_id": digest[:16], "hash": digest})
    with store.transaction("freezing a baseline") as con:
        _insert(con, baseline)
        if activate:
            _record(con, cohort, "activate", baseline.baseline_id, baseline.created_at, author, note)
    return get_baseline(store, baseline.baseline_id)


def _bucket_ceil(t: datetime, width: int) -> datetime:
    epoch = t.timestamp()
    return datetime.fromtimestamp(-(-epoch // width) * width, UTC)


def _insert(con: Any, b: Baseline) -> bool:
    """Insert if absent (by id); True when it was new."""
    rows = con.execute(
        """INSERT INTO baselines VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT DO NOTHING RETURNING baseline_id""",
        [b.baseline_id, b.hash, *b.cohort, b.since, b.until, b.samples, b.author, b.note, b.created_at,
         _canonical(b.document()).decode()]).fetchall()
    return bool(rows)


def _cohort_id(store: Store, cohort: Cohort) -> int | None:
    rows = store.query("SELECT cohort_id FROM cohorts WHERE model = ? AND prompt_version = ? AND contract = ?",
                       list(cohort))
    return int(rows[0][0]) if rows else None


# --- reading --------------------------------------------------------------------------------

def get_baseline(store: Store, baseline_id: str) -> Baseline:
    """The baseline with this id (or a unique prefix of it, at least 6 characters)."""
    if len(baseline_id) < 6:
        raise BaselineNotFound(f"{baseline_id!r} (give at least 6 characters of the id)")
    rows = store.query("SELECT document FROM baselines WHERE starts_with(baseline_id, ?) LIMIT 2",
                       [baseline_id])
    if not rows:
        raise BaselineNotFound(repr(baseline_id))
    if len(rows) > 1:
        raise BaselineNotFound(f"{baseline_id!r}: the prefix matches several baselines; give more of the id")
    return _verified(str(rows[0][0]), where=f"stored baseline {baseline_id}")


_VERIFIED: dict[str, Baseline] = {}  # document text -> baseline; frozen documents never change


def _verified(text: str, *, where: str = "stored baseline") -> Baseline:
    # Every evaluation reads each cohort's baseline; parsing and re-hashing a large document
    # each time would cost more than the comparison. The cache key is the whole stored text,
    # so a document edited in the file is verified (and refused) again.
    b = _VERIFIED.get(text)
    if b is None:
        b = baseline_from_document(orjson.loads(text), where=where)
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
    where, params = ("WHERE model = ? AND prompt_version = ? AND contract = ?", list(cohort)) if cohort else ("", [])
    return [Activation(Cohort(r[0], r[1], r[2]), ActivationAction(r[3]), r[4], r[5], r[6], r[7])
            for r in store.query(f"""SELECT model, prompt_version, contract, action, baseline_id, activated_at, author, note
                                     FROM baseline_activations {where} ORDER BY seq""", params)]


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


def resolve_baseline(store: Store, cohort: Cohort, *, current: dict[Cohort, Activation] | None = None,
                     first_seen: dict[Cohort, datetime] | None = None,
                     aliases: dict[tuple[str, str, str], list[tuple[str, str, str]]] | None = None
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


def _resolve(store: Store, cohort: Cohort, current: dict[Cohort, Activation],
             first_seen: dict[Cohort, datetime] | None) -> Resolved | None:
    act = current.get(cohort)
    if act is not None and act.action is ActivationAction.retire:
        return None
    if act is not None and act.baseline_id is not None:
        if act.action is ActivationAction.activate:
            return Resolved(get_baseline(store, act.baseline_id), "own")
        if act.action is ActivationAction.inherit:
            return Resolved(get_baseline(store, act.baseline_id), "parent")
    if first_seen is None:
        first_seen = {Cohort(str(m), str(p), str(c)): t for m, p, c, t in store.query(
            "SELECT model, prompt_version, contract, first_seen FROM cohorts")}
    mine = first_seen.get(cohort)
    if mine is None:
        return None
    # Only cohorts with an active baseline can be inherited from: look among those (a few),
    # never through every cohort (with 10,000 cohorts that was 10,000 x 10,000 comparisons).
    earlier = sorted(((t, prev, pa.baseline_id) for prev, pa in current.items()
                      if pa.action is ActivationAction.activate and pa.baseline_id is not None
                      and prev.model == cohort.model and prev.contract == cohort.contract and prev != cohort
                      and (t := first_seen.get(prev)) is not None and t < mine), reverse=True)
    if earlier:
        return Resolved(get_baseline(store, earlier[0][2]), "previous_prompt_version")
    return None


@dataclass(frozen=True)
class BaselineListing:
    baseline: Baseline
    active: bool  # the active baseline of its own cohort


def list_baselines(store: Store, cohort: Cohort | None = None) -> list[BaselineListing]:
    """Every baseline (of one cohort, or all), newest first, with whether it is active."""
    where, params = ("WHERE model = ? AND prompt_version = ? AND contract = ?", list(cohort)) if cohort else ("", [])
    current = _current(store)
    active = {a.baseline_id for a in current.values() if a.action is ActivationAction.activate}
    out = []
    for (doc,) in store.query(f"SELECT document FROM baselines {where} ORDER BY created_at DESC, baseline_id",
                              params):
        b = _verified(str(doc))
        out.append(BaselineListing(b, b.baseline_id in active))
    return out


# --- activation -----------------------------------------------------------------------------

def _record(con: Any, cohort: Cohort, action: str, baseline_id: str | None, at: datetime, author: str,
            note: str) -> None:
    con.execute("""INSERT INTO baseline_activations (model, prompt_version, contract, action, baseline_id, activated_at,
                                                      author, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                [*cohort, action, baseline_id, at, author, note])


def activate_baseline(store: Store, baseline_id: str, *, author: str, note: str = "",
                      now: datetime | None = None) -> Baseline:
    """Make a baseline the active one of its own cohort (the previous one stays in history)."""
    b = get_baseline(store, baseline_id)
    with store.transaction("activating a baseline") as con:
        _record(con, b.cohort, "activate", b.baseline_id, now or datetime.now(UTC), author, note)
    return b


def inherit_baseline(store: Store, cohort: Cohort, parent_id: str, *, author: str, note: str = "",
                     now: datetime | None = None) -> Baseline:
    """Compare ``cohort`` (a rollout with no history of its own) against another cohort's baseline."""
    b = get_baseline(store, parent_id)
    with store.transaction("naming a parent baseline") as con:
        _record(con, cohort, "inherit", b.baseline_id, now or datetime.now(UTC), author, note)
    return b


def retire_baseline(store: Store, cohort: Cohort, *, author: str, note: str = "",
                    now: datetime | None = None) -> None:
    """Stop comparing ``cohort`` against its baseline (history keeps it)."""
    if cohort not in _current(store):
        raise BaselineNotFound(f"active for cohort {cohort}")
    with store.transaction("retiring a baseline") as con:
        _record(con, cohort, "retire", None, now or datetime.now(UTC), author, note)


# --- export and import ----------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _component(s: str) -> str:
    # Model ids and versions become directory names: anything outside a safe set is
    # percent-escaped, so "a/b" or ".." can never leave the export directory.
    out = _UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), s)
    return out if out not in ("", ".", "..") else out.replace(".", "%2E") or "%00"


def export_path(out_dir: Path, b: Baseline) -> Path:
    return (out_dir / _component(b.cohort.model) / _component(b.cohort.prompt_version)
            / _component(b.cohort.contract) / f"{b.until.astimezone(UTC):%Y-%m-%d}-{b.baseline_id}.json")


def export_baselines(store: Store, out_dir: Path, cohort: Cohort | None = None) -> list[Path]:
    """Write every baseline as a canonical JSON file (sorted keys, two-space indent); returns the paths."""
    written = []
    for listing in list_baselines(store, cohort):
        path = export_path(out_dir, listing.baseline)
        write_document(path, listing.baseline)
        written.append(path)
    return written


def write_document(path: Path, b: Baseline) -> None:
    """Write one baseline as canonical JSON (sorted keys, two-space indent, final newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(b.document(), option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n")


def import_baseline(store: Store, path: Path) -> tuple[Baseline, bool]:
    """Import one exported file; returns (baseline, whether it was new). The same file twice is a no-op."""
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read ({exc.strerror})") from exc
    except orjson.JSONDecodeError as exc:
        raise BaselineError(f"{path}: not JSON ({exc})") from exc
    return import_document(store, doc, where=str(path))


def import_document(store: Store, doc: Any, *, where: str = "baseline document") -> tuple[Baseline, bool]:
    """Store an exported document as it is; returns (baseline, whether it was new).

    Refused when its content does not match its hash; a no-op when already stored.
    """
    if not isinstance(doc, dict):
        raise BaselineError(f"{where}: not a baseline document (a JSON object is expected)")
    b = baseline_from_document(doc, where=where)
    with store.transaction("importing a baseline") as con:
        new = _insert(con, b)
    return b, new
