"""Bulk import through a running service (``shapewatch ingest FILE... --url URL``): the files a
local import would read, sent to ``POST /v1/outputs`` as NDJSON batches, with the same summary.

When the service holds the database file, a local import cannot open it; this sends the lines
instead. Each file is read the way the local import reads it (plain or ``.gz``, a byte order
mark dropped, blank lines skipped, a file that breaks off listed as unreadable with the lines
before the fault sent), and a line without an ``event_id`` gets the id the local import would
give it (``rules.line_id`` over the file's absolute path, the line number and its bytes), so
sending a file twice, or importing it locally after sending it, stores each line once. The id is
put in front of the line's own text, which is otherwise sent byte for byte: the service judges
every line exactly as the local import would (duplicate keys, numbers out of range, bad UTF-8).

Rejected lines are not quarantined beside a database this process does not have: the first
``MAX_LISTED`` are returned with their line numbers and reasons (``RemoteImport.rejected_lines``).

>>> summary = send_files([Path("outputs.jsonl")], "http://127.0.0.1:8000")   # doctest: +SKIP
>>> summary.summary.as_dict()["accepted"]                                       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from .errors import ImportInputError, ShapewatchError
from .ingest import ImportSummary, _file_key, _Lines
from .rules import line_id

__all__ = ["MAX_BATCH_BYTES", "MAX_BATCH_LINES", "MAX_LISTED", "RemoteImport", "RemoteImportFailed", "send_files"]

MAX_BATCH_LINES = 1000
MAX_BATCH_BYTES = 4 << 20  # well under the service's default max_body_bytes (16 MiB)
MAX_LISTED = 100


class RemoteImportFailed(ShapewatchError):
    """The service could not be reached, refused the token, or failed: the import stops there
    (``partial``: what was sent before)."""

    partial: RemoteImport | None = None


@dataclass
class RemoteImport:
    summary: ImportSummary = field(default_factory=ImportSummary)
    rejected_lines: list[dict[str, Any]] = field(default_factory=list)  # file, line, errors (first MAX_LISTED)


def _with_id(line: bytes, prefix: str, n: int) -> bytes:
    """The line, with the local import's id in front when it is an object without ``event_id``."""
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line  # the service says what is wrong with it
    if not isinstance(doc, dict) or "event_id" in doc:
        return line
    event_id = orjson.dumps(line_id(prefix, n, line))
    body = line.lstrip()[1:].lstrip()
    return b'{"event_id":' + event_id + (b"," if body[:1] != b"}" else b"") + body


def send_files(
    paths: list[Path],
    url: str,
    *,
    token: str | None = None,
    timeout: float = 120.0,
    progress: Callable[[int], None] | None = None,
    client: httpx.Client | None = None,
) -> RemoteImport:
    """Send every line of ``paths`` to the service at ``url``; a file given twice is read once.

    Raises ``RemoteImportFailed`` when the service cannot take a batch (unreachable, 401/403,
    5xx): the summary up to then is in the exception's ``partial``."""
    out = RemoteImport()
    headers = {"Content-Type": "application/x-ndjson"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    own = client is None
    http = client or httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
    try:
        for path in {p.resolve(): p for p in paths}.values():
            _send_file(http, path, headers, out, progress)
    except RemoteImportFailed as exc:
        exc.partial = out
        raise
    finally:
        if own:
            http.close()
    return out


def _send_file(
    http: httpx.Client,
    path: Path,
    headers: dict[str, str],
    out: RemoteImport,
    progress: Callable[[int], None] | None,
) -> None:
    lines = _Lines(path)
    prefix = _file_key(path)
    batch: list[tuple[int, bytes]] = []
    size = 0
    reported = 0
    for n, raw in lines:
        line = raw.strip()
        if not line:
            continue
        body = _with_id(line, prefix, n)
        if batch and (len(batch) >= MAX_BATCH_LINES or size + len(body) > MAX_BATCH_BYTES):
            _post(http, path, batch, headers, out)
            batch, size = [], 0
        batch.append((n, body))
        size += len(body) + 1
        if progress is not None and lines.consumed - reported >= 1 << 20:
            progress(lines.consumed - reported)
            reported = lines.consumed
    if batch:
        _post(http, path, batch, headers, out)
    if progress is not None:
        progress(lines.consumed - reported)
    if lines.error is not None:
        out.summary.unreadable.append(ImportInputError(path, lines.error))


def _post(
    http: httpx.Client, path: Path, batch: list[tuple[int, bytes]], headers: dict[str, str], out: RemoteImport
) -> None:
    try:
        r = http.post("/v1/outputs", content=b"\n".join(body for _, body in batch) + b"\n", headers=headers)
    except httpx.HTTPError as exc:
        raise RemoteImportFailed(f"cannot reach the service at {http.base_url}: {exc}") from exc
    if r.status_code == 413 and len(batch) > 1:  # a body over the service's limit: halve it
        half = len(batch) // 2
        _post(http, path, batch[:half], headers, out)
        _post(http, path, batch[half:], headers, out)
        return
    if r.status_code in (413, 422) and len(batch) == 1:
        _rejected(out, path, batch[0][0], _errors(r), "too_large" if r.status_code == 413 else "invalid")
        return
    if r.status_code >= 400:
        raise RemoteImportFailed(f"the service at {http.base_url} answered {r.status_code}: {_message(r)}")
    reply = r.json()
    s = out.summary
    s.accepted += int(reply.get("accepted", 0))
    s.duplicate += int(reply.get("duplicate", 0))
    s.rejected += int(reply.get("rejected", 0))
    for reason, k in (reply.get("rejected_by_reason") or {}).items():
        s.rejected_by_reason[str(reason)] += int(k)
    for item in reply.get("results") or []:
        if item.get("status") == "rejected" and len(out.rejected_lines) < MAX_LISTED:
            out.rejected_lines.append(
                {"file": str(path), "line": batch[int(item["index"])][0], "errors": item.get("errors") or []}
            )


def _rejected(out: RemoteImport, path: Path, n: int, errors: list[Any], reason: str) -> None:
    out.summary.rejected += 1
    out.summary.rejected_by_reason[reason] += 1
    if len(out.rejected_lines) < MAX_LISTED:
        out.rejected_lines.append({"file": str(path), "line": n, "errors": errors})


def _errors(r: httpx.Response) -> list[Any]:
    try:
        err = r.json()["error"]
        return list(err.get("fields") or [{"path": None, "reason": err.get("message")}])
    except (ValueError, KeyError, TypeError):
        return [{"path": None, "reason": r.text[:300]}]


def _message(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:300] or r.reason_phrase
