"""The accelerator against the parse floor and a well-kept library for the same job (msgspec).

Before more C is written for bulk import, this measures what the C's envelope reader
(``_speedups.scan_lines``) buys over what a maintained library gives: on one file of
``bench/gen.py`` envelopes, read once into memory, in this process, each step timed alone
(best of ``--repeat``, the garbage collector off as bulk import runs it):

- floor: ``orjson.loads`` of every line, nothing else (the reference of the 4x target);
- msgspec typed: ``msgspec.json.Decoder`` of a Struct with the envelope's fields (unknown
  fields refused, tags typed, ``ts`` parsed to a datetime, the output decoded to dicts);
- msgspec typed, output raw: the same with the output left as its raw text (``msgspec.Raw``);
- msgspec + the rest: the typed decode, then in Python what the C does besides reading
  (the output's canonical and sorted text through orjson, the payload hash, the Envelope);
  a C-free path to the same envelopes would cost at least this;
- C scan_lines: the accelerator, every check, canonical text, payload hash and Envelope;
- Python twin scan_lines (``collector/_pyspeedups.py``, when present), on the first
  ``--twin-lines`` lines only, scaled.

msgspec is a bench-only dependency (``pip install msgspec``); the script says so when it is
missing and measures the rest.

    .venv/bin/python bench/gen.py --n 200000 --out /tmp/env.jsonl
    .venv/bin/python bench/accel_floor.py --file /tmp/env.jsonl
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson

try:
    import msgspec

    HAVE_MSGSPEC = True
except ImportError:  # a bench-only dependency: its rows are then left out
    HAVE_MSGSPEC = False

from shapewatch.collector import _speedups
from shapewatch.collector.envelope import LIMITS, Envelope, _epoch_us, payload_hash

NOW = datetime(2026, 12, 1, tzinfo=UTC)
#: envelopes kept at once: bulk import hands them on in blocks (ingest._ADD_EVERY)
BLOCK = 1024
_LIM = LIMITS.scanner

if HAVE_MSGSPEC:
    # the tag rules msgspec can state: a length (not "not blank", "no NUL": left to the rest)
    Tag = Annotated[str, msgspec.Meta(min_length=1, max_length=LIMITS.max_tag_length)]
    EventId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]

    class Env(msgspec.Struct, forbid_unknown_fields=True):
        model: Tag
        prompt_version: Tag
        output: dict[str, Any]
        event_id: EventId | None = None
        ts: datetime | None = None
        contract: Tag | None = None
        served_model: Tag | None = None
        contract_version: Tag | None = None
        source: Literal["production", "probe", "shadow"] | None = None
        run_id: Tag | None = None
        agent_release: Tag | None = None
        finish_reason: Tag | None = None
        attributes: dict[str, Any] | None = None

    class RawEnv(msgspec.Struct, forbid_unknown_fields=True):  # Env with the output left as its text
        model: Tag
        prompt_version: Tag
        output: msgspec.Raw
        event_id: EventId | None = None
        ts: datetime | None = None
        contract: Tag | None = None
        served_model: Tag | None = None
        contract_version: Tag | None = None
        source: Literal["production", "probe", "shadow"] | None = None
        run_id: Tag | None = None
        agent_release: Tag | None = None
        finish_reason: Tag | None = None
        attributes: dict[str, Any] | None = None


def best_of(repeat: int, step: Callable[[], int]) -> tuple[float, int]:
    """(best seconds, events) of ``repeat`` runs of ``step``, which returns the events it made."""
    best, events = float("inf"), 0
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            start = time.perf_counter()
            events = step()
            best = min(best, time.perf_counter() - start)
        finally:
            gc.enable()
    return best, events


def keep_blocks(make: Callable[[bytes], object], lines: list[bytes]) -> int:
    """``make`` of every line, the results kept a block at a time, as bulk import keeps them."""
    block: list[object] = []
    for line in lines:
        block.append(make(line))
        if len(block) == BLOCK:
            block = []
    return len(lines)


def floor(lines: list[bytes]) -> int:
    return keep_blocks(orjson.loads, lines)


def scan_lines_of(module: Any, text: bytes) -> Callable[[], int]:
    def step() -> int:
        at = n = made = 0
        while at < len(text):
            out: list[Envelope] = []
            origin: list[int] = []
            at, n, start, end = module.scan_lines(
                text, at, n, "f", Envelope, NOW, BLOCK, out, origin, LIMITS.max_event_bytes, *_LIM
            )
            made += len(out) + (start >= 0)  # a declined line: the reference path would read it
        return made

    return step


def msgspec_steps(lines: list[bytes]) -> dict[str, Callable[[], int]]:
    typed = msgspec.json.Decoder(Env)
    raw = msgspec.json.Decoder(RawEnv)

    def decode_typed() -> int:
        return keep_blocks(typed.decode, lines)

    def decode_raw() -> int:
        return keep_blocks(raw.decode, lines)

    def decode_and_finish() -> int:
        d = typed.decode
        dumps, sort = orjson.dumps, orjson.OPT_SORT_KEYS
        out: list[Envelope] = []
        walk = _speedups.walk
        for n, line in enumerate(lines, 1):
            e = d(line)
            if walk(e.output, *_LIM[1:]) is None:  # the output's limits: the C walk, as the validator uses it
                raise ValueError(f"line {n}: over a limit")
            text = dumps(e.output)
            contract = e.contract or "default"
            tags = (e.served_model, e.contract_version, e.run_id, e.agent_release, e.finish_reason)
            digest = payload_hash(
                dumps(e.output, option=sort),
                e.model,
                e.prompt_version,
                contract,
                None if e.ts is None else _epoch_us(e.ts),
                e.source,
                None,
                tags,
            )
            event_id = e.event_id or f"f:{n}:{hashlib.blake2b(line, digest_size=8).hexdigest()}"
            out.append(
                Envelope(
                    event_id,
                    e.event_id is None,
                    e.ts or NOW,
                    e.model,
                    e.prompt_version,
                    contract,
                    text.decode(),
                    digest,
                    *tags[:2],
                    e.source,
                    *tags[2:],
                )
            )
            if len(out) == BLOCK:
                out = []
        return len(lines)

    return {
        "msgspec typed": decode_typed,
        "msgspec typed, output raw": decode_raw,
        "msgspec + the rest in Python": decode_and_finish,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, required=True, help="JSONL of bench/gen.py envelopes")
    ap.add_argument("--lines", type=int, default=200_000, help="lines of the file to read (default 200,000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each step; the best counts (default 3)")
    ap.add_argument("--twin-lines", type=int, default=20_000, help="lines for the pure-Python twin (default 20,000)")
    args = ap.parse_args(argv)

    with args.file.open("rb") as f:
        lines = [line.strip() for _, line in zip(range(args.lines), f, strict=False)]
    lines = [line for line in lines if line]
    text = b"\n".join(lines)
    print(f"{len(lines):,} envelopes, {len(text) / len(lines):.0f} B a line, best of {args.repeat}")

    steps: dict[str, tuple[Callable[[], int], int]] = {"floor: orjson.loads": (lambda: floor(lines), 1)}
    if HAVE_MSGSPEC:
        for name, step in msgspec_steps(lines).items():
            steps[name] = (step, 1)
    else:
        print("msgspec is not installed (a bench-only dependency: pip install msgspec); its rows are left out")
    steps["C scan_lines"] = (scan_lines_of(_speedups, text), 1)
    try:
        from shapewatch.collector import _pyspeedups
    except ImportError:
        print("no pure-Python twin (collector/_pyspeedups.py); its row is left out")
    else:
        twin = lines[: args.twin_lines]
        steps["Python twin scan_lines"] = (scan_lines_of(_pyspeedups, b"\n".join(twin)), len(lines) // len(twin))

    floor_s = 0.0
    print(f"{'step':<32} {'seconds':>9} {'events/s':>12} {'x floor':>8}")
    for name, (step, scale) in steps.items():
        seconds, events = best_of(args.repeat if scale == 1 else 1, step)
        seconds *= scale
        events *= scale
        if not floor_s:
            floor_s = seconds
        scaled = f" (x{scale}: {events // scale:,} lines)" if scale > 1 else ""
        print(f"{name:<32} {seconds:>9.3f} {events / seconds:>12,.0f} {seconds / floor_s:>7.2f}x{scaled}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
