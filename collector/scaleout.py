"""Scale-out mode: stateless collectors publish validated envelopes to NATS JetStream, workers
pull them per shard and commit them to the lake (``store/lake.py``), then acknowledge them.

- **Collector** (``collector_app``): the embedded service's validation (``envelope.parse_body``,
  the same limits), then one JetStream publish per accepted envelope with ``Nats-Msg-Id`` = its
  event id to ``<subject>.<shard>``, shard = ``shard_of(event_id)``. The client hears 200 only
  once JetStream acknowledged every event of its request (stored on a majority of the R3
  stream's nodes, each with ``sync_interval: always``); otherwise 503 with ``Retry-After``, and a
  retry is deduplicated (JetStream's duplicate window, then the workers' stored keys).
- **Worker** (``run_worker``): holds a share of the shards (a PostgreSQL advisory lock each, so
  one worker at a time writes a shard, which is what makes the lake's lookup-then-insert of keys
  race-free), pulls a batch per shard from its durable consumer, writes it with
  ``LakeWriter.write_batch`` (keys, events and rollups in one DuckLake transaction) and acks
  only after the commit. A worker killed anywhere in between leaves the batch unacked:
  JetStream redelivers it after ``ack_wait`` and the stored keys turn it into duplicates.

A conflict (an id stored before with another payload) can no longer be answered to the client,
who heard 200 when JetStream took the event: the worker logs it, counts it and stores nothing.
The same request within the stream's duplicate window is answered ``duplicate`` already at
publish.

>>> cfg = ScaleOutConfig.from_toml(Path("scaleout.toml"))     # doctest: +SKIP
>>> uvicorn.run(collector_app(cfg), port=8000)                # doctest: +SKIP
>>> asyncio.run(run_worker(cfg, name="w1"))                    # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import signal
import time
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response

from .api import guarded_route, install_error_handlers, require_token
from .envelope import Envelope, Limits, parse_body
from .errors import EnvelopeInvalid, SettingsInvalid, ShapewatchError, StoreError
from .settings import Scope, check_tokens
from .store.lake import LakeConfig, LakeWriter

__all__ = [
    "ScaleOutConfig",
    "ScaleOutConfigError",
    "collector_app",
    "decode_envelope",
    "encode_envelope",
    "run_worker",
    "shard_of",
]

log = logging.getLogger(__name__)

LOCK_SHARDS = 0x5357_0010  # advisory lock namespace: (LOCK_SHARDS, shard)
LOCK_WORKERS = 0x5357_0011  # shared by every live worker: how many there are
LOCK_ANALYZER = 0x5357_0012  # the one active analyzer
_MAX_TOKENS = 1000
_MAX_TOKEN_LENGTH = 4096


class ScaleOutConfigError(ShapewatchError, ValueError):
    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"scale-out configuration: {key}: {reason}")
        self.key = key


@dataclass(frozen=True)
class ScaleOutConfig:
    """The ``[scaleout]`` table of a TOML file (docs/scale-out.md lists every key)."""

    nats_servers: tuple[str, ...]
    pg_dsn: str
    data_path: str
    stream: str = "SHAPEWATCH"
    subject: str = "shapewatch.events"
    shards: int = 8
    replicas: int = 3
    duplicate_window_seconds: float = 120.0
    publish_timeout_seconds: float = 5.0
    ack_wait_seconds: float = 30.0
    batch_events: int = 2000
    dedup_ttl_days: float = 7.0
    bucket_seconds: int = 60
    max_body_bytes: int = 16 * 1024 * 1024
    max_request_events: int = 10_000
    # Bearer tokens, as the embedded service's ``tokens`` setting (SECRET or SCOPE[+SCOPE]:SECRET):
    # a collector asks for one with the ingest scope, an API node (``scaleout api``/``analyzer
    # --port``) for read on GETs and admin on writes. Empty: no authentication.
    tokens: tuple[str, ...] = ()
    # S3-compatible object storage for an s3:// data_path (MinIO, S3, R2...); unset keys use
    # DuckDB's defaults (and the AWS credential chain).
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    s3_url_style: str | None = None
    s3_use_ssl: bool | None = None
    limits: Limits = field(default_factory=Limits)

    @property
    def lake(self) -> LakeConfig:
        s3 = {
            "endpoint": self.s3_endpoint,
            "region": self.s3_region,
            "key_id": self.s3_access_key_id,
            "secret": self.s3_secret_access_key,
            "url_style": self.s3_url_style,
            "use_ssl": None if self.s3_use_ssl is None else str(self.s3_use_ssl).lower(),
        }
        return LakeConfig(self.pg_dsn, self.data_path, s3=tuple((k, v) for k, v in s3.items() if v is not None))

    def subject_of(self, shard: int) -> str:
        return f"{self.subject}.{shard}"

    @classmethod
    def from_toml(cls, path: Path) -> ScaleOutConfig:
        try:
            doc = tomllib.loads(path.read_text())
        except OSError as exc:
            raise ScaleOutConfigError(str(path), f"cannot be read ({exc.strerror})") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ScaleOutConfigError(str(path), f"is not valid TOML ({exc})") from exc
        table = doc.get("scaleout")
        if not isinstance(table, dict):
            raise ScaleOutConfigError("scaleout", "the file needs a [scaleout] table")
        return cls.from_mapping(table)

    @classmethod
    def from_mapping(cls, table: dict[str, Any]) -> ScaleOutConfig:
        known = {f.name for f in fields(cls)} - {"limits"}
        for key in table:
            if key not in known:
                raise ScaleOutConfigError(key, f"unknown key (known: {', '.join(sorted(known))})")
        for key in ("nats_servers", "pg_dsn", "data_path"):
            if key not in table:
                raise ScaleOutConfigError(key, "is required")
        servers = table["nats_servers"]
        if (
            not isinstance(servers, list)
            or not servers
            or not all(isinstance(s, str) and s.startswith(("nats://", "tls://")) for s in servers)
        ):
            raise ScaleOutConfigError("nats_servers", "must be a non-empty list of nats:// or tls:// URLs")
        values: dict[str, Any] = {"nats_servers": tuple(servers)}
        for key in (
            "pg_dsn",
            "data_path",
            "stream",
            "subject",
            "s3_endpoint",
            "s3_region",
            "s3_access_key_id",
            "s3_secret_access_key",
        ):
            if key in table:
                v = table[key]
                if not isinstance(v, str) or not v.strip() or len(v) > 4096:
                    raise ScaleOutConfigError(key, "must be a non-empty string")
                values[key] = v
        if "tokens" in table:
            tokens = table["tokens"]
            if (
                not isinstance(tokens, list)
                or len(tokens) > _MAX_TOKENS
                or not all(isinstance(t, str) and 0 < len(t) <= _MAX_TOKEN_LENGTH for t in tokens)
            ):
                raise ScaleOutConfigError(
                    "tokens",
                    f"must be a list of at most {_MAX_TOKENS} strings of 1 to {_MAX_TOKEN_LENGTH} characters "
                    "(SECRET or SCOPE[+SCOPE]:SECRET)",
                )
            try:
                check_tokens(tokens)
            except SettingsInvalid as exc:  # the embedded service's rules and reasons
                raise ScaleOutConfigError("tokens", str(exc).removeprefix("setting 'tokens': ")) from None
            values["tokens"] = tuple(tokens)
        if "s3_url_style" in table:
            if table["s3_url_style"] not in ("path", "vhost"):
                raise ScaleOutConfigError("s3_url_style", "must be 'path' or 'vhost'")
            values["s3_url_style"] = table["s3_url_style"]
        if "s3_use_ssl" in table:
            if not isinstance(table["s3_use_ssl"], bool):
                raise ScaleOutConfigError("s3_use_ssl", "must be true or false")
            values["s3_use_ssl"] = table["s3_use_ssl"]
        if "stream" in values and not values["stream"].replace("_", "").replace("-", "").isalnum():
            raise ScaleOutConfigError("stream", "may hold letters, digits, '-' and '_' only")
        ranges: dict[str, tuple[type, float, float]] = {
            "shards": (int, 1, 1024),
            "replicas": (int, 1, 5),
            "duplicate_window_seconds": (float, 1, 86_400),
            "publish_timeout_seconds": (float, 0.1, 120),
            "ack_wait_seconds": (float, 1, 3600),
            "batch_events": (int, 1, 100_000),
            "dedup_ttl_days": (float, 0.01, 365),
            "bucket_seconds": (int, 1, 3600),
            "max_body_bytes": (int, 1024, 1 << 30),
            "max_request_events": (int, 1, 1_000_000),
        }
        for key, (kind, lo, hi) in ranges.items():
            if key not in table:
                continue
            v = table[key]
            if isinstance(v, bool) or not isinstance(v, int | float) or (kind is int and not isinstance(v, int)):
                raise ScaleOutConfigError(key, f"must be {'an integer' if kind is int else 'a number'}, not {v!r}")
            if not lo <= v <= hi or (isinstance(v, float) and not math.isfinite(v)):
                raise ScaleOutConfigError(key, f"must be between {lo:g} and {hi:g}, not {v!r}")
            values[key] = kind(v)
        return cls(**values)


def shard_of(event_id: str, shards: int) -> int:
    """The shard of an event id: the same in every process (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(event_id.encode(), digest_size=8).digest(), "big") % shards


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def encode_envelope(env: Envelope) -> bytes:
    """A validated envelope as the stream carries it: its fields but the parsed output, ``ts``
    as microseconds. The worker rebuilds it without validating again (the collector did)."""
    return orjson.dumps([env[0], env[1], (env.ts - _EPOCH) // timedelta(microseconds=1), *env[3:-1]])


def decode_envelope(data: bytes) -> Envelope:
    row = orjson.loads(data)
    if not isinstance(row, list) or len(row) != len(Envelope._fields) - 1:
        raise ValueError("not an envelope of the scale-out stream")
    row[2] = _EPOCH + timedelta(microseconds=row[2])
    return Envelope._make([*row, None])


# --- the collector -------------------------------------------------------------------------------


class _Publisher:
    """The collector's connection to JetStream, made at start and remade by nats-py on failover."""

    def __init__(self, cfg: ScaleOutConfig) -> None:
        self.cfg = cfg
        self.nc: Any = None
        self.js: Any = None

    async def start(self) -> None:
        import nats

        self.nc = await nats.connect(
            servers=list(self.cfg.nats_servers),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            connect_timeout=2,
        )
        self.js = self.nc.jetstream(timeout=self.cfg.publish_timeout_seconds)
        await ensure_stream(self.js, self.cfg)

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()

    async def publish(self, env: Envelope) -> bool:
        """True when JetStream stored the event now, False when it had it already (duplicate window)."""
        ack = await self.js.publish(
            self.cfg.subject_of(shard_of(env.event_id, self.cfg.shards)),
            encode_envelope(env),
            timeout=self.cfg.publish_timeout_seconds,
            stream=self.cfg.stream,
            headers={"Nats-Msg-Id": env.event_id},
        )
        return not ack.duplicate


async def ensure_stream(js: Any, cfg: ScaleOutConfig) -> None:
    """The stream and one durable pull consumer per shard; creating what exists changes nothing."""
    from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
    from nats.js.errors import BadRequestError

    config = StreamConfig(
        name=cfg.stream,
        subjects=[f"{cfg.subject}.*"],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        num_replicas=cfg.replicas,
        duplicate_window=cfg.duplicate_window_seconds,
    )

    async def retried(make: Any) -> None:
        # A cluster electing its meta leader, or with a node down, answers with timeouts and
        # "unavailable" for a few seconds.
        deadline = time.monotonic() + 60
        while True:
            try:
                await make()
                return
            except BadRequestError as exc:
                if "already in use" in str(exc) or getattr(exc, "err_code", 0) == 10058:
                    return
                raise
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)

    await retried(lambda: js.add_stream(config))
    for shard in range(cfg.shards):
        consumer = ConsumerConfig(
            durable_name=f"shard-{shard}",
            filter_subject=cfg.subject_of(shard),
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=cfg.ack_wait_seconds,
            max_ack_pending=-1,
            max_deliver=-1,
        )
        await retried(lambda c=consumer: js.add_consumer(cfg.stream, c))


def _error(
    status: int, message: str, fields: list[dict[str, str]] | None = None, *, retry_after: bool = False
) -> Response:
    body = {"error": {"status": status, "message": message, "fields": fields or []}}
    headers = {"Retry-After": "1"} if retry_after else None
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def collector_app(cfg: ScaleOutConfig) -> FastAPI:
    """The scale-out collector: ``POST /v1/outputs`` (validated as the embedded service does)
    published to JetStream, and ``GET /healthz``."""
    publisher = _Publisher(cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await publisher.start()
        yield
        await publisher.close()

    app = FastAPI(title="shapewatch scale-out collector", lifespan=lifespan)
    # The embedded service's token check (collector/api.py), before the body is read: no token
    # or an unknown one 401, a token without the ingest scope 403, in the shared error shape.
    app.state.token_guard = require_token(cfg.tokens, Scope.ingest)
    install_error_handlers(app)
    ingest = APIRouter(route_class=guarded_route(Scope.ingest))

    @ingest.post("/v1/outputs", operation_id="ingest_events")
    async def ingest_events(request: Request) -> Response:
        kind = (request.headers.get("content-type") or "application/json").split(";")[0].strip().lower()
        if kind not in ("application/json", "application/x-ndjson", "application/jsonl"):
            return _error(415, f"content-type {kind!r} is not accepted: send application/json or application/x-ndjson")
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
            return _error(413, f"the body is {declared} bytes; the limit is {cfg.max_body_bytes}")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > cfg.max_body_bytes:
                return _error(413, f"the body is over the limit of {cfg.max_body_bytes} bytes")
        raw = bytes(body)
        ndjson = kind != "application/json"
        single = not ndjson and not raw.lstrip().startswith(b"[")
        try:
            items = await asyncio.to_thread(
                lambda: list(parse_body(raw, cfg.limits, ndjson=ndjson, max_items=cfg.max_request_events))
            )
        except EnvelopeInvalid as exc:
            return _error(
                exc.status if exc.status != 422 or single else 400,
                "the body is not a valid envelope" if single else "the body is not valid JSON",
                [f.as_dict() for f in exc.fields],
            )
        except ShapewatchError as exc:  # BatchTooLarge
            return _error(413, str(exc))
        envs = [i for i in items if isinstance(i, Envelope)]
        try:
            fresh = await asyncio.gather(*(publisher.publish(e) for e in envs))
        except Exception as exc:
            # Some events may be in the stream: the client's retry (same ids) is deduplicated.
            log.warning("publishing %d events to JetStream failed: %s", len(envs), exc)
            return _error(
                503,
                f"the event queue did not acknowledge the events ({type(exc).__name__}); retry",
                retry_after=True,
            )
        results: list[dict[str, Any]] = []
        counts = {"accepted": 0, "duplicate": 0, "rejected": 0}
        it = iter(fresh)
        for i, item in enumerate(items):
            if isinstance(item, EnvelopeInvalid):
                counts["rejected"] += 1
                results.append(
                    {
                        "index": i,
                        "event_id": item.event_id,
                        "status": "rejected",
                        "errors": [f.as_dict() for f in item.fields],
                    }
                )
                continue
            status = "accepted" if next(it) else "duplicate"
            counts[status] += 1
            results.append({"index": i, "event_id": item.event_id, "status": status})
        if single and counts["rejected"]:
            return _error(422, "the envelope was rejected", results[0]["errors"])
        return Response(orjson.dumps({**counts, "results": results}), media_type="application/json")

    app.include_router(ingest)

    @app.get("/healthz", operation_id="get_health")
    async def get_health() -> Response:
        nc = publisher.nc
        if nc is None or not nc.is_connected:
            return _error(503, "not connected to NATS", retry_after=True)
        return Response(orjson.dumps({"status": "ok", "nats": nc.connected_url.netloc}), media_type="application/json")

    return app


# --- the worker ----------------------------------------------------------------------------------


class _Shards:
    """The shards this worker holds: an advisory lock each on its own PostgreSQL session, a fair
    share of them (shards / live workers, rounded up), rebalanced every few seconds."""

    def __init__(self, cfg: ScaleOutConfig, name: str) -> None:
        import psycopg

        self.cfg = cfg
        self.pg = psycopg.connect(cfg.pg_dsn, autocommit=True, application_name=f"shapewatch-worker-{name}"[:63])
        self.pg.execute("SELECT pg_advisory_lock_shared(%s, 0)", [LOCK_WORKERS])
        self.held: set[int] = set()

    def live_workers(self) -> int:
        row = self.pg.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = 0 AND granted",
            [LOCK_WORKERS],
        ).fetchone()
        return max(1, int(row[0]) if row else 1)

    def rebalance(self) -> tuple[set[int], set[int]]:
        """(shards taken, shards given up) by this round."""
        fair = math.ceil(self.cfg.shards / self.live_workers())
        given: set[int] = set()
        while len(self.held) > fair:
            shard = max(self.held)
            self.pg.execute("SELECT pg_advisory_unlock(%s, %s)", [LOCK_SHARDS, shard])
            self.held.discard(shard)
            given.add(shard)
        taken: set[int] = set()
        order = list(range(self.cfg.shards))
        random.shuffle(order)
        for shard in order:
            if len(self.held) >= fair:
                break
            if shard in self.held:
                continue
            row = self.pg.execute("SELECT pg_try_advisory_lock(%s, %s)", [LOCK_SHARDS, shard]).fetchone()
            if row and row[0]:
                self.held.add(shard)
                taken.add(shard)
        return taken, given


class _WorkerStats:
    """What a worker did, logged every 10 s: where its time goes (the lake's commit, the rest)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts = {"accepted": 0, "duplicate": 0, "conflict": 0}
        self.batches = 0
        self.write_s = 0.0
        self.since = time.monotonic()

    def maybe_report(self) -> None:
        if time.monotonic() - self.since >= 10 and self.batches:
            self.report("progress")

    def report(self, what: str) -> None:
        span = time.monotonic() - self.since
        events = sum(self.counts.values())
        log.info(
            "worker %s %s: %d batches, %d events (%s) in %.1f s, %.1f s of it writing to the lake, %.0f events/batch",
            self.name,
            what,
            self.batches,
            events,
            self.counts,
            span,
            self.write_s,
            events / max(self.batches, 1),
        )
        self.counts = dict.fromkeys(self.counts, 0)
        self.batches = 0
        self.write_s = 0.0
        self.since = time.monotonic()


async def _quietly(aw: Any) -> None:
    try:
        await aw
    except Exception as exc:
        log.warning("%s", exc)


async def _handle(
    writer: LakeWriter, nc: Any, fetched: list[tuple[int, Any]], ttl: timedelta, stats: _WorkerStats
) -> None:
    """Write one fetched batch (messages of the shards held), then ack it; a failed write naks
    it (redelivered)."""
    envs: list[Envelope] = []
    shards: list[int] = []
    good = []
    for shard, m in fetched:
        try:
            envs.append(decode_envelope(m.data))
            shards.append(shard)
            good.append(m)
        except (ValueError, TypeError) as exc:
            log.error("a message of shard %d is not an envelope (%s): terminated", shard, exc)
            await _quietly(m.term())
    t0 = time.monotonic()
    try:
        results = await asyncio.to_thread(writer.write_batch, envs, shard=shards, dedup_ttl=ttl)
    except StoreError as exc:
        log.error("writing %d events failed (%s); they are redelivered", len(envs), exc)
        for m in good:
            await _quietly(m.nak(delay=1.0))
        return
    stats.write_s += time.monotonic() - t0
    stats.batches += 1
    for r in results:
        stats.counts[r.status.value] += 1
        if r.status.value == "conflict":
            log.warning("event %s: conflict (its id was stored with another payload); not stored", r.event_id)
    # Acked only now, after the commit: a worker killed before this line leaves the batch
    # unacked, JetStream redelivers it after ack_wait and the stored keys make it duplicates.
    for m in good:
        await _quietly(m.ack())
    await _quietly(nc.flush())


async def run_worker(cfg: ScaleOutConfig, *, name: str, stop: asyncio.Event | None = None) -> None:
    """Pull, write, ack, until ``stop`` is set (or SIGTERM/SIGINT)."""
    import nats
    from nats.errors import TimeoutError as NatsTimeout

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    writer = await asyncio.to_thread(LakeWriter.open, cfg.lake, bucket_seconds=cfg.bucket_seconds)
    nc = await nats.connect(
        servers=list(cfg.nats_servers), max_reconnect_attempts=-1, reconnect_time_wait=0.2, connect_timeout=2
    )
    js = nc.jetstream(timeout=10)
    await ensure_stream(js, cfg)
    shards = _Shards(cfg, name)
    subs: dict[int, Any] = {}
    ttl = timedelta(days=cfg.dedup_ttl_days)
    next_balance = 0.0
    stats = _WorkerStats(name)
    try:
        while not stop.is_set():
            if time.monotonic() >= next_balance:
                taken, given = await asyncio.to_thread(shards.rebalance)
                for shard in given:
                    sub = subs.pop(shard, None)
                    if sub is not None:
                        await _quietly(sub.unsubscribe())
                if taken or given:
                    log.info("worker %s holds shards %s", name, sorted(shards.held))
                next_balance = time.monotonic() + 2.0
            for shard in shards.held - subs.keys():
                # During a NATS node's failover JetStream answers "unavailable" for a while:
                # the shard stays held and is bound at a later round.
                try:
                    subs[shard] = await js.pull_subscribe_bind(durable=f"shard-{shard}", stream=cfg.stream)
                except Exception as exc:
                    log.warning("binding shard %d failed (%s); trying again", shard, exc)
            fetched: list[tuple[int, Any]] = []
            for shard, sub in list(subs.items()):
                try:
                    msgs = await sub.fetch(cfg.batch_events, timeout=0.05)
                except (TimeoutError, NatsTimeout):
                    continue
                except Exception as exc:  # a node failing over: the same fetch again later
                    log.warning("fetching shard %d failed (%s); trying again", shard, exc)
                    await asyncio.sleep(0.2)
                    continue
                fetched.extend((shard, m) for m in msgs)
            busy = bool(fetched)
            if fetched:
                # one commit for what every shard held gave: the lake's cost is per commit
                await _handle(writer, nc, fetched, ttl, stats)
            stats.maybe_report()
            if not busy:
                await asyncio.sleep(0.05)
    finally:
        stats.report("stops")
        try:
            await nc.close()
        finally:
            shards.pg.close()
            writer.close()
