"""Settings of the collector and the service: one frozen value built once at start-up.

Precedence: explicit overrides (CLI options) > ``SHAPEWATCH_*`` environment
variables > a TOML file (``[shapewatch]`` table or top level) > defaults.

>>> s = load_settings({"db_path": "var/x.duckdb"}, env={})
>>> s.bucket_seconds
60
"""

from __future__ import annotations

import dataclasses
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

from .errors import SettingsInvalid
from .tiers import DAY, HOUR, TierPolicy

__all__ = [
    "Scope",
    "Settings",
    "TokenEntry",
    "check_tokens",
    "load_settings",
    "parse_token",
    "settings_help",
    "size_bytes",
]


class Scope(StrEnum):
    """What a bearer token may do on the HTTP API.

    ``ingest``: POST /v1/outputs and /v1/provider/*; ``read``: every GET of the API and
    /metrics; ``admin``: every other write (baselines, acknowledgements, silences,
    analyzer runs). The scopes are independent: a dashboard that also freezes baselines
    needs ``read+admin``.
    """

    ingest = "ingest"
    read = "read"
    admin = "admin"


class TokenEntry(NamedTuple):
    """One entry of ``Settings.tokens``: the secret a client sends and the scopes it grants."""

    secret: str
    scopes: frozenset[Scope]


def parse_token(entry: str) -> TokenEntry:
    """``SECRET`` (every scope) or ``SCOPE[+SCOPE]:SECRET``; SettingsInvalid names what is wrong.

    >>> entry = parse_token("read+admin:s3cret")
    >>> entry.secret, sorted(s.value for s in entry.scopes)
    ('s3cret', ['admin', 'read'])
    >>> parse_token("s3cret").scopes == frozenset(Scope)
    True

    Any ``:`` makes the entry scoped (secrets made by ``secrets.token_urlsafe`` have none),
    so a mistyped scope is refused rather than read as part of a secret.
    """
    prefix, colon, secret = entry.partition(":")
    if not colon:
        secret, scopes = entry, frozenset(Scope)
    else:
        known = {s.value for s in Scope}
        names = prefix.split("+")
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SettingsInvalid(
                "tokens",
                f"scope {unknown[0]!r} of an entry is unknown; write SECRET (all "
                "scopes) or SCOPE[+SCOPE]:SECRET with scopes " + ", ".join(sorted(known)),
            )
        scopes = frozenset(Scope(n) for n in names)
    if not secret or secret != secret.strip() or any(c.isspace() for c in secret):
        raise SettingsInvalid(
            "tokens",
            "an entry has an empty secret or one with white space; "
            "use a random string such as `python -c 'import secrets; print(secrets.token_urlsafe())'`",
        )
    return TokenEntry(secret, scopes)


def check_tokens(tokens: Sequence[str]) -> list[TokenEntry]:
    """Every entry parsed (``parse_token``), and no secret given twice; SettingsInvalid names
    ``tokens`` and what is wrong. The embedded service's settings and the scale-out
    configuration check their tokens here, so both refuse the same entries the same way."""
    entries = [parse_token(t) for t in tokens]
    secrets = [e.secret for e in entries]
    if len(set(secrets)) != len(secrets):
        raise SettingsInvalid(
            "tokens", "two entries share a secret; give each secret once, with all its scopes (SCOPE+SCOPE:SECRET)"
        )
    return entries


# A size as DuckDB reads it (memory_limit, checkpoint_threshold): a number and a unit.
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B|bytes?)\s*", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def size_bytes(text: str) -> int:
    """Bytes in a size written as DuckDB reads it: ``512MB`` (10^6), ``1GiB`` (2^30), ``100 bytes``.

    >>> size_bytes("1.5GB"), size_bytes("2 KiB")
    (1500000000, 2048)
    """
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a size; write a number and a unit such as 512MB or 1GB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def _s(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class Settings:
    """Every knob of the collector and service, each with a default and help text."""

    db_path: Path = _s(Path("var/shapewatch.duckdb"), "DuckDB database file the service owns.")
    host: str = _s("127.0.0.1", "Address the HTTP service binds; loopback unless told otherwise.")
    port: int = _s(8000, "Port of the HTTP service.", min=1, max=65535)
    tokens: tuple[str, ...] = _s(
        (),
        "Bearer tokens accepted by the HTTP API (comma-separated in the environment); empty means "
        "no authentication. Each entry is SECRET (every scope) or SCOPE[+SCOPE]:SECRET, the client "
        "sending only SECRET; scopes: ingest (POST /v1/outputs, /v1/provider/*), read (every GET, "
        "/metrics), admin (other writes: baselines, acks, silences, analyzer runs). Missing or "
        "unknown token: 401; a valid token without the route's scope: 403. /healthz stays open "
        "for liveness probes.",
    )
    memory_limit: str = _s(
        "1GB",
        "DuckDB working memory of the service; the store adds about 64 bytes per stored event "
        "for the idempotency index, which DuckDB keeps in memory.",
    )
    import_memory_limit: str = _s(
        "256MB",
        "DuckDB working memory of bulk import (shapewatch ingest), which needs little cache; "
        "plus the index, as for memory_limit.",
    )
    duckdb_threads: int = _s(
        1,
        "DuckDB worker threads. One by default: on two, DuckDB 1.5.6 lost sight of rows its own session "
        "inserted after a large parallel insert (found with bench/repro_invisible_rows.py; the file on disk "
        "was right). One thread also suits the service, whose statements are small: HTTP ingest measured "
        "6-7% more events/s with 10% less CPU, and a steady 2,000 events/s took 0.24 of a core instead of "
        "0.82; bulk import took about 1 s longer per 1M lines (bench/README.md).",
        min=1,
        max=256,
    )
    checkpoint_threshold: str = _s(
        "256MB",
        "Write-ahead log size at which DuckDB checkpoints (writes the log into the file). A "
        "checkpoint costs more as the file grows: at DuckDB's own 16MB they took a third of the write time "
        "(bench/README.md). A larger log takes longer to replay after a crash.",
    )
    max_body_bytes: int = _s(
        16 * 1024 * 1024,
        "Largest HTTP request body an ingest route (/v1/outputs, /v1/provider/*, /v1/traces) accepts (413 above).",
        min=1024,
    )
    max_document_bytes: int = _s(
        16 * 1024 * 1024,
        "Largest HTTP request body of the routes that take a document "
        "(POST /v1/baselines/import, POST /v1/contracts); 413 above.",
        min=1024,
    )
    max_admin_body_bytes: int = _s(
        64 * 1024, "Largest HTTP request body of every other route (silences, acks, freezes, ...); 413 above.", min=1024
    )
    body_idle_seconds: float = _s(
        30.0, "A request body that sends no byte for this long is answered 408, on every route.", min=0.01, max=3600.0
    )
    body_total_seconds: float = _s(
        300.0, "A request body not whole this long after the request began is answered 408.", min=0.01, max=86_400.0
    )
    header_timeout_seconds: float = _s(
        10.0,
        "A connection that has not sent a whole request head this long after opening (or after its "
        "first byte following a keep-alive pause) is closed.",
        min=0.01,
        max=3600.0,
    )
    keep_alive_seconds: int = _s(5, "An idle keep-alive connection is closed after this many seconds.", min=1, max=3600)
    max_connections: int = _s(
        1000,
        "Most connections the service holds; a new one beyond closes the oldest connection still "
        "waiting for its request head, or gets 503 with Retry-After when every connection is busy.",
        min=2,
        max=1_000_000,
    )
    max_event_bytes: int = _s(1024 * 1024, "Largest single envelope (one JSONL line) accepted.", min=256)
    max_depth: int = _s(32, "Deepest nesting of objects and arrays inside an output.", min=1, max=512)
    max_array_length: int = _s(10_000, "Longest array inside an output.", min=1)
    max_key_length: int = _s(256, "Longest object key inside an output.", min=1)
    max_leaves: int = _s(10_000, "Most leaf values (non-container values) inside one output.", min=1)
    max_attributes: int = _s(32, "Most entries in an envelope's attributes map.", min=0)
    max_tag_length: int = _s(256, "Longest string in the envelope's tag fields and attribute values.", min=1)
    enum_value_max_length: int = _s(
        64, "Strings up to this length are kept as values (enum candidates) in the rollups.", min=1
    )
    enum_values_per_path: int = _s(
        200, "Most distinct values kept per cohort, time bucket and path; more go to an overflow count.", min=1
    )
    free_text_min_distinct: int = _s(
        200,
        "A rollup merge keeps no values of a path that holds more distinct short strings than this for a "
        "cohort, repeated fewer than ten times each on average (free text: ids, names, addresses); they "
        "count as overflow (0: keep the values of every path).",
        min=0,
    )
    redact_paths: tuple[str, ...] = _s(
        (),
        "Field paths whose values are never stored in rollups, nor shown in sample outputs (comma-separated "
        "in the environment): `customer.email`, `messages[].text`, `*` for any run of characters "
        "(`*.email`). Presence and type counts of the path are kept.",
    )
    contract_checks_per_bucket: int = _s(
        500,
        "Outputs checked against their registered contract version per cohort, version and time bucket; "
        "the rest are counted as unchecked (0: check every output).",
        min=0,
    )
    contract_check_ms: float = _s(
        50.0,
        "Longest one output's contract check may take: beyond it the output counts as unchecked "
        "(reason slow). Checks run after the output was acknowledged, never on the request's path.",
        min=0.1,
        max=10_000.0,
    )
    contract_check_budget_ms: float = _s(
        1000.0,
        "Time the contract checks of one contract version may take per rollup merge: the version's "
        "remaining outputs of that merge count as unchecked (reason budget).",
        min=1.0,
        max=600_000.0,
    )
    bucket_seconds: int = _s(60, "Width of a rollup time bucket in seconds.", min=1, max=86_400)
    minute_buckets_hours: int = _s(
        24,
        "Rollup tiers: how far back from each cohort's newest data rollups keep minute buckets; older "
        "ones are hour buckets (0: minute buckets for good, no tiers).",
        min=0,
        max=24 * 366,
    )
    hour_buckets_days: int = _s(
        3,
        "Rollup tiers: how far back from each cohort's newest data rollups keep hour buckets; older ones "
        "are day buckets. At least one day more than minute_buckets_hours.",
        min=1,
        max=3660,
    )
    dedup_ttl_days: float = _s(
        7.0,
        "How long an event_id is remembered for deduplication: a copy sent later is stored again. "
        "The key index DuckDB keeps in memory holds this many days of keys.",
        min=0.0,
    )
    raw_retention_days: float = _s(
        30.0, "How long raw outputs are kept (rollups are kept for good); independent of dedup_ttl_days.", min=0.0
    )
    batch_max_events: int = _s(5000, "Most events one group-commit transaction holds.", min=1)
    batch_max_wait_ms: float = _s(
        10.0,
        "How long the writer waits for more requests before committing a batch: a lone request "
        "waits this long; under load fewer, bigger commits (10 rather than 2 measured 10% more events/s).",
        min=0.0,
    )
    rollup_merge_events: int = _s(
        20_000,
        "The service merges rollups after this many stored events, on a thread of its own "
        "while events keep committing.",
        min=1,
    )
    rollup_merge_seconds: float = _s(
        1.0,
        "... or after this many seconds, whichever comes first. Every read of rollups (analyzer, "
        "dashboard) merges what is pending first, so a longer interval saves merge CPU (5 s: a quarter "
        "less service CPU at 2,000 events/s) but makes those reads pay for the merge.",
        min=0.0,
    )
    writer_queue_events: int = _s(200_000, "Events waiting for the writer before new requests get 503.", min=1)
    otlp_prompt_version_attribute: str = _s(
        "shapewatch.prompt_version",
        "POST /v1/traces: the span attribute (else resource attribute) naming an event's prompt_version.",
    )
    otlp_default_prompt_version: str = _s(
        "unversioned", "POST /v1/traces: the prompt_version of spans that carry no otlp_prompt_version_attribute."
    )
    otlp_contract_attribute: str = _s(
        "shapewatch.contract",
        "POST /v1/traces: the span or resource attribute naming the contract of structured outputs "
        "(tool calls take the tool's name); default contract 'default'.",
    )
    otlp_agent_release_attribute: str = _s(
        "service.version",
        "POST /v1/traces: the span or resource attribute naming an event's agent_release.",
    )
    run_idle_seconds: float = _s(
        300.0,
        "An agent run is complete, and judged (run-level signals, mined cases), once no step of it "
        "arrived for this long; never half-way.",
        min=1.0,
        max=7 * 86_400.0,
    )
    cases_per_rule_day: int = _s(
        50, "Most runs one mining rule queues as cases per day; the rest are counted, not queued.", min=0
    )
    handoff_tools: tuple[str, ...] = _s(
        (),
        "Tool names that mark a handoff to a human (comma-separated in the environment): a run "
        "calling one is mined as a case.",
    )

    def __post_init__(self) -> None:
        check_tokens(self.tokens)
        from .privacy import RedactPatterns

        RedactPatterns.parse(self.redact_paths)
        for name in ("memory_limit", "import_memory_limit", "checkpoint_threshold"):
            if not _SIZE.fullmatch(getattr(self, name)):
                raise SettingsInvalid(
                    name, f"{getattr(self, name)!r} is not a size; write a number and a unit such as 512MB or 1GB"
                )
        for f in fields(self):
            lo, hi = f.metadata.get("min"), f.metadata.get("max")
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise SettingsInvalid(f.name, f"{v!r} is not a finite number")
            if lo is not None and v < lo:
                raise SettingsInvalid(f.name, f"{v!r} is below the minimum {lo}; set it to {lo} or more")
            if hi is not None and v > hi:
                raise SettingsInvalid(f.name, f"{v!r} is above the maximum {hi}; set it to {hi} or less")
        if self.minute_buckets_hours:
            if self.hour_buckets_days * 24 < self.minute_buckets_hours + 24:
                raise SettingsInvalid(
                    "hour_buckets_days",
                    f"{self.hour_buckets_days} days does not reach one day beyond minute_buckets_hours "
                    f"({self.minute_buckets_hours} hours); set it to {-(-self.minute_buckets_hours // 24) + 1} or more",
                )
            if 3600 % self.bucket_seconds:
                raise SettingsInvalid(
                    "bucket_seconds",
                    f"{self.bucket_seconds} does not divide an hour, which rollup tiers need; choose a divisor "
                    "of 3600 or set minute_buckets_hours to 0",
                )
        if self.host not in ("127.0.0.1", "localhost", "::1") and not self.tokens:
            # Not an error (a reverse proxy may authenticate), but never silent.
            import logging

            logging.getLogger(__name__).warning("binding %s without tokens: anyone who reaches it can write", self.host)

    @property
    def tiers(self) -> TierPolicy | None:
        """The rollup tiers these settings ask for (None: minute buckets only)."""
        if not self.minute_buckets_hours:
            return None
        return TierPolicy(self.minute_buckets_hours * HOUR, self.hour_buckets_days * DAY)


def settings_help() -> dict[str, str]:
    """Each setting's name and help text (documentation and the docs test use it)."""
    return {f.name: f.metadata["help"] for f in fields(Settings)}


def _coerce(name: str, raw: Any) -> Any:
    f = {f.name: f for f in fields(Settings)}.get(name)
    if f is None:
        raise SettingsInvalid(name, "unknown setting; known settings: " + ", ".join(settings_help()))
    default = f.default
    try:
        if isinstance(default, bool):
            return raw if isinstance(raw, bool) else str(raw).lower() in ("1", "true", "yes", "on")
        if isinstance(default, Path):
            return Path(raw)
        if isinstance(default, tuple):
            if isinstance(raw, str):
                return tuple(t.strip() for t in raw.split(",") if t.strip())
            return tuple(str(t) for t in raw)
        if isinstance(default, int):
            # Refuse what int() would quietly bend: true -> 1, 3.9 -> 3.
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(raw)
        if isinstance(default, float):
            if isinstance(raw, bool):
                raise ValueError(raw)
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError(raw)
            return value
        return str(raw)
    except (TypeError, ValueError) as exc:
        kind = {"int": "whole number", "float": "finite number"}.get(type(default).__name__, type(default).__name__)
        raise SettingsInvalid(name, f"{raw!r} is not a valid {kind}") from exc


def load_settings(
    overrides: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str],
    toml_path: Path | None = None,
) -> Settings:
    """Build the settings: overrides > SHAPEWATCH_* env > TOML file > defaults."""
    values: dict[str, Any] = {}
    path = toml_path or (Path(env["SHAPEWATCH_CONFIG"]) if env.get("SHAPEWATCH_CONFIG") else None)
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsInvalid("config", f"cannot read {path}: {exc}") from exc
        table = data.get("shapewatch", data)
        for k, v in table.items():
            if isinstance(v, dict):
                continue  # other sections (analysis rules, contracts) belong to other packages
            values[k] = _coerce(k, v)
    for k, v in env.items():
        if k.startswith("SHAPEWATCH_") and k != "SHAPEWATCH_CONFIG":
            name = k[len("SHAPEWATCH_") :].lower()
            if name in settings_help():
                values[name] = _coerce(name, v)
    for k, v in (overrides or {}).items():
        if v is not None:
            values[k] = _coerce(k, v)
    return dataclasses.replace(Settings(), **values)
