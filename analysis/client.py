"""Where the admin CLI gets its answers: the database file (``--db``) or the service (``--url``).

Both backends expose the same methods and return the same JSON values: the
local one calls ``admin.py`` on the file, the remote one calls the HTTP
routes that call ``admin.py`` in the service. Remote errors come back as
``RemoteError`` carrying the service's message and status.

>>> with backend(db="var/x.duckdb", url=None, token=None, settings=s, config=c) as b:   # doctest: +SKIP
...     b.list_baselines()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from shapewatch.baselines import Cohort
from shapewatch.collector import Settings, ShapewatchError, Store

from . import admin
from .config import AnalyzerConfig

if TYPE_CHECKING:
    from .probes import ProbeRun

__all__ = ["Backend", "RemoteError", "backend"]


class RemoteError(ShapewatchError):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"the service answered {status}: {message}")


class Backend(Protocol):
    def freeze(
        self,
        *,
        model: str,
        prompt_version: str,
        contract: str,
        since: datetime,
        until: datetime,
        author: str,
        note: str,
        force: str | None,
        activate: bool,
        source: str = "production",
    ) -> dict[str, Any]: ...
    def list_baselines(self, cohort: Cohort | None = None) -> list[dict[str, Any]]: ...
    def show(self, baseline_id: str) -> dict[str, Any]: ...
    def activate(self, baseline_id: str, *, author: str, note: str) -> dict[str, Any]: ...
    def retire(self, cohort: Cohort, *, author: str, note: str) -> dict[str, Any]: ...
    def inherit(self, cohort: Cohort, parent: str, *, author: str, note: str) -> dict[str, Any]: ...
    def import_document(self, doc: dict[str, Any], where: str) -> dict[str, Any]: ...
    def alerts(self, **filters: str | None) -> list[dict[str, Any]]: ...
    def acknowledge(self, fingerprint: str, *, by: str) -> dict[str, Any]: ...
    def silence(self, *, duration: str, author: str, reason: str, **match: str | None) -> dict[str, Any]: ...
    def silences(self, *, active: bool = True) -> list[dict[str, Any]]: ...
    def expire_silence(self, silence_id: int) -> dict[str, Any]: ...
    def cohorts(self) -> list[dict[str, Any]]: ...
    def review(self, since: str) -> dict[str, Any]: ...
    def register_contract(
        self, contract: str, version: str, document: Any, *, author: str, note: str | None
    ) -> dict[str, Any]: ...
    def list_contracts(self, contract: str | None = None) -> list[dict[str, Any]]: ...
    def show_contract(self, contract: str, version: str) -> dict[str, Any]: ...
    def run(self, run_id: str) -> dict[str, Any]: ...
    def compare(self, a: str, b: str, since: datetime, until: datetime) -> dict[str, Any]: ...
    def record_probe_run(self, run: ProbeRun) -> None: ...


class LocalBackend:
    def __init__(self, store: Store, config: AnalyzerConfig) -> None:
        self.store = store
        self.config = config

    def freeze(
        self,
        *,
        model: str,
        prompt_version: str,
        contract: str,
        since: datetime,
        until: datetime,
        author: str,
        note: str,
        force: str | None,
        activate: bool,
        source: str = "production",
    ) -> dict[str, Any]:
        return admin.freeze(
            self.store,
            self.config,
            model=model,
            prompt_version=prompt_version,
            contract=contract,
            since=since,
            until=until,
            author=author,
            note=note,
            force=force,
            activate=activate,
            source=source,
        )

    def list_baselines(self, cohort: Cohort | None = None) -> list[dict[str, Any]]:
        return admin.list_all(self.store, cohort)

    def show(self, baseline_id: str) -> dict[str, Any]:
        return admin.show(self.store, baseline_id)

    def activate(self, baseline_id: str, *, author: str, note: str) -> dict[str, Any]:
        return admin.activate(self.store, baseline_id, author=author, note=note)

    def retire(self, cohort: Cohort, *, author: str, note: str) -> dict[str, Any]:
        return admin.retire(self.store, cohort, author=author, note=note)

    def inherit(self, cohort: Cohort, parent: str, *, author: str, note: str) -> dict[str, Any]:
        return admin.inherit(self.store, cohort, parent, author=author, note=note)

    def import_document(self, doc: dict[str, Any], where: str) -> dict[str, Any]:
        return admin.import_document(self.store, doc, where=where)

    def register_contract(
        self, contract: str, version: str, document: Any, *, author: str, note: str | None
    ) -> dict[str, Any]:
        return admin.register_contract(self.store, contract, version, document, author=author, note=note)

    def list_contracts(self, contract: str | None = None) -> list[dict[str, Any]]:
        return admin.list_contracts(self.store, contract)

    def show_contract(self, contract: str, version: str) -> dict[str, Any]:
        return admin.show_contract(self.store, contract, version)

    def run(self, run_id: str) -> dict[str, Any]:
        from shapewatch.collector.traces import RunNotFound, run_view

        view = run_view(self.store, run_id)
        if view is None:
            raise RunNotFound(run_id)
        return view

    def record_probe_run(self, run: ProbeRun) -> None:
        from .probes import record_run

        record_run(self.store, run)

    def compare(self, a: str, b: str, since: datetime, until: datetime) -> dict[str, Any]:
        from .compare import compare_cohorts, parse_cohort

        return compare_cohorts(self.store, self.config, parse_cohort(a, "a"), parse_cohort(b, "b"), since, until)

    def alerts(self, **filters: str | None) -> list[dict[str, Any]]:
        f = filters.get
        return admin.alerts(
            self.store,
            state=f("state"),
            severity=f("severity"),
            model=f("model"),
            prompt_version=f("prompt_version"),
            contract=f("contract"),
            kind=f("kind"),
            source=f("source"),
        )

    def acknowledge(self, fingerprint: str, *, by: str) -> dict[str, Any]:
        return admin.acknowledge(self.store, fingerprint, by=by)

    def silence(self, *, duration: str, author: str, reason: str, **match: str | None) -> dict[str, Any]:
        from .config import MAX_SILENCE, parse_duration

        return admin.silence(
            self.store,
            duration=parse_duration(duration, key="--duration", maximum=MAX_SILENCE),
            author=author,
            reason=reason,
            **match,
        )

    def silences(self, *, active: bool = True) -> list[dict[str, Any]]:
        return admin.silences(self.store, active=active)

    def expire_silence(self, silence_id: int) -> dict[str, Any]:
        return admin.expire_silence(self.store, silence_id)

    def cohorts(self) -> list[dict[str, Any]]:
        return admin.cohorts(self.store)

    def review(self, since: str) -> dict[str, Any]:
        from .config import MAX_REVIEW_PERIOD, parse_duration
        from .review import build_review

        return build_review(
            self.store,
            self.config,
            period=parse_duration(since, key="--since", maximum=MAX_REVIEW_PERIOD),
            max_baseline_age=self.config.max_baseline_age,
        )


class RemoteBackend:
    def __init__(self, url: str, token: str | None, timeout: float = 60.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise ShapewatchError(f"cannot reach the service at {self.client.base_url}: {exc}") from exc
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except Exception:
                message = r.text[:500]
            raise RemoteError(r.status_code, message)
        return r.json()

    def freeze(
        self,
        *,
        model: str,
        prompt_version: str,
        contract: str,
        since: datetime,
        until: datetime,
        author: str,
        note: str,
        force: str | None,
        activate: bool,
        source: str = "production",
    ) -> dict[str, Any]:
        body = {
            "model": model,
            "prompt_version": prompt_version,
            "contract": contract,
            "since": since.isoformat(),
            "until": until.isoformat(),
            "author": author,
            "note": note,
            "force": force,
            "activate": activate,
            "source": source,
        }
        result: dict[str, Any] = self._call("POST", "/v1/baselines", json=body)
        return result

    def list_baselines(self, cohort: Cohort | None = None) -> list[dict[str, Any]]:
        params = cohort._asdict() if cohort else {}
        result: list[dict[str, Any]] = self._call("GET", "/v1/baselines", params=params)
        return result

    def show(self, baseline_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/baselines/{baseline_id}")
        return result

    def activate(self, baseline_id: str, *, author: str, note: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", f"/v1/baselines/{baseline_id}/activate", json={"author": author, "note": note}
        )
        return result

    def retire(self, cohort: Cohort, *, author: str, note: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", "/v1/baselines/retire", json={**cohort._asdict(), "author": author, "note": note}
        )
        return result

    def inherit(self, cohort: Cohort, parent: str, *, author: str, note: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", "/v1/baselines/inherit", json={**cohort._asdict(), "parent": parent, "author": author, "note": note}
        )
        return result

    def import_document(self, doc: dict[str, Any], where: str) -> dict[str, Any]:
        try:
            result: dict[str, Any] = self._call("POST", "/v1/baselines/import", json=doc)
        except RemoteError as exc:  # name the file, as the local backend does
            raise RemoteError(exc.status, f"{where}: {exc.message}") from exc
        return result

    def alerts(self, **filters: str | None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/alerts", params={k: v for k, v in filters.items() if v})
        return result

    def record_probe_run(self, run: ProbeRun) -> None:
        envelopes = run.envelopes
        for i in range(0, len(envelopes), 500):
            self._call("POST", "/v1/outputs", json=envelopes[i : i + 500])
        doc = run.to_json()
        body = {
            **{k: doc[k] for k in ("run_id", "suite", "model", "served_model", "prompt_version", "contract")},
            **{k: doc[k] for k in ("trigger", "started_at", "finished_at", "scores", "thresholds")},
            "cases": [r.to_json() for r in run.results],
        }
        self._call("POST", "/v1/probes/runs", json=body)

    def compare(self, a: str, b: str, since: datetime, until: datetime) -> dict[str, Any]:
        params = {"a": a, "b": b, "since": since.isoformat(), "until": until.isoformat()}
        result: dict[str, Any] = self._call("GET", "/v1/compare", params=params)
        return result

    def acknowledge(self, fingerprint: str, *, by: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/alerts/{fingerprint}/ack", json={"author": by})
        return result

    def silence(self, *, duration: str, author: str, reason: str, **match: str | None) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST",
            "/v1/silences",
            json={"duration": duration, "author": author, "reason": reason, **{k: v for k, v in match.items() if v}},
        )
        return result

    def silences(self, *, active: bool = True) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/silences", params={"active": str(active).lower()})
        return result

    def expire_silence(self, silence_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/silences/{silence_id}/expire")
        return result

    def cohorts(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/cohorts")
        return result

    def review(self, since: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/v1/review", params={"since": since, "format": "json"})
        return result

    def register_contract(
        self, contract: str, version: str, document: Any, *, author: str, note: str | None
    ) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST",
            "/v1/contracts",
            json={"contract": contract, "version": version, "document": document, "author": author, "note": note},
        )
        return result

    def list_contracts(self, contract: str | None = None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call(
            "GET", "/v1/contracts", params={"contract": contract} if contract else {}
        )
        return result

    def show_contract(self, contract: str, version: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "GET", "/v1/contracts/item", params={"contract": contract, "version": version}
        )
        return result

    def run(self, run_id: str) -> dict[str, Any]:
        from urllib.parse import quote

        result: dict[str, Any] = self._call("GET", f"/v1/runs/{quote(run_id, safe='')}")
        return result


@contextmanager
def backend(
    *, url: str | None, token: str | None, settings: Settings, config: AnalyzerConfig, create: bool = False
) -> Iterator[Backend]:
    """The remote backend with ``url``, else the database file of ``settings`` (opened, then closed;
    created only with ``create``, for importing baselines into a new deployment)."""
    if url:
        remote = RemoteBackend(url, token)
        try:
            yield remote
        finally:
            remote.client.close()
        return
    from .store_access import open_store

    if not create and not settings.db_path.exists():
        # Never create a database here: a mistyped --db would read as an empty, all-clear one.
        raise ShapewatchError(
            f"database {settings.db_path} does not exist (check --db; `shapewatch serve` or "
            "`shapewatch ingest` create it)"
        )
    store = open_store(settings)
    try:
        yield LocalBackend(store, config)
    finally:
        store.close()
