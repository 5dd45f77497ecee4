"""Notifiers: the outbox, the pager formats, retries and restarts against a real local pager.

The pager is ``pager_receiver.PagerReceiver``: a threaded HTTP server on loopback
that keeps incidents like PagerDuty (by dedup_key) and answers scripted statuses
or drops connections. The outbox is a real DuckDB file under tmp_path. Time is
passed to ``deliver`` explicitly: nothing here sleeps to wait for a retry.
"""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pager_receiver import ACCEPT_THEN_DROP, DROP, HANG, Incident, PagerReceiver, Step
from prometheus_client import CollectorRegistry

from shapewatch.analysis.errors import NotifyConfigInvalid
from shapewatch.analysis.notify import (
    NOTIFY_SCHEMA,
    PAGERDUTY_EVENTS_URL,
    DeliveryReport,
    Notice,
    NoticeAction,
    Notifier,
    Target,
    TargetKind,
    digest_url_from_config,
    enqueue,
    notice_for,
    send_digest,
    summarize_alert,
    targets_from_config,
)
from shapewatch.collector import Store, StoreError

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
MODEL = "claude-sonnet-4-5-20250929"
SUMMARY = f"presence_drop on customer.tier ({MODEL}, intake-v3, intake): presence 61.0% -> 30.0% (p < 1e-6)"
ROUTING_KEY = "R0UT1NGKEY0000000000000000000000"


def make_alert(**overrides: Any) -> dict[str, Any]:
    """An alert as the README shows it; keyword arguments replace top-level fields."""
    alert: dict[str, Any] = {
        "cohort": {"model": MODEL, "prompt_version": "intake-v3", "contract": "intake"},
        "field": "customer.tier",
        "kind": "presence_drop",
        "severity": "page",
        "state": "firing",
        "fingerprint": "fp-tier",
        "baseline": {"presence_rate": 0.61, "samples": 5000},
        "current": {"presence_rate": 0.30, "samples": 3000},
        "detail": "presence 61.0% -> 30.0% (p < 1e-6)",
    }
    alert.update(overrides)
    return alert


def trigger(episode: int = 1, dashboard_url: str | None = None, **alert: Any) -> Notice:
    return notice_for(make_alert(**alert), episode=episode, action=NoticeAction.trigger, dashboard_url=dashboard_url)


def resolve(episode: int = 1, **alert: Any) -> Notice:
    return notice_for(make_alert(state="resolved", **alert), episode=episode, action=NoticeAction.resolve)


def pd_target(pager: PagerReceiver, **kw: Any) -> Target:
    kw.setdefault("timeout_seconds", 5.0)
    return Target("pd", TargetKind.pagerduty, pager.url, routing_key=ROUTING_KEY, **kw)


def raise_notices(store: Store, targets: list[Target], notices: list[Notice], now: datetime) -> int:
    """What the alert lifecycle does: enqueue inside the transaction that changes alert state."""
    with store.transaction("changing alert state") as con:
        return enqueue(con, targets, notices, now)


def outbox_rows(store: Store) -> list[tuple[Any, ...]]:
    return store.query("""SELECT target, fingerprint, episode, action, state, attempts, last_error
                          FROM notifications ORDER BY target, fingerprint, episode, action = 'resolve'""")


def sent_events(pager: PagerReceiver) -> list[tuple[str, str]]:
    return [(b["event_action"], b["dedup_key"]) for b in pager.bodies()]


@pytest.fixture
def pager() -> Iterator[PagerReceiver]:
    with PagerReceiver() as receiver:
        yield receiver


@pytest.fixture
def outbox(db_path: Path) -> Iterator[Store]:
    store = Store.open(db_path, schemas=[NOTIFY_SCHEMA])
    yield store
    store.close()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def notifier(outbox: Store, registry: CollectorRegistry) -> Iterator[Callable[..., Notifier]]:
    made: list[Notifier] = []

    def make(targets: list[Target], *, store: Store | None = None, **kw: Any) -> Notifier:
        kw.setdefault("backoff_base", 0.0)
        kw.setdefault("rng", random.Random(7))
        kw.setdefault("registry", registry)
        n = Notifier(store or outbox, targets, **kw)
        made.append(n)
        return n

    yield make
    for n in made:
        n.close()


# --- exactly one incident per fingerprint ------------------------------------------------------


def test_retries_through_500_429_and_a_dropped_connection_open_exactly_one_incident(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier], registry: CollectorRegistry
) -> None:
    target = pd_target(pager)
    n = notifier([target])
    assert raise_notices(outbox, [target], [trigger()], T0) == 1
    pager.script(500, Step(429, {"Retry-After": "0"}), DROP, 202)

    reports = [n.deliver(T0 + timedelta(seconds=i)) for i in range(5)]

    assert reports == [DeliveryReport(retried=1)] * 3 + [DeliveryReport(sent=1), DeliveryReport()]
    assert [r.answer for r in pager.requests] == [500, 429, DROP, 202]
    assert sent_events(pager) == [("trigger", "fp-tier")] * 4
    assert pager.incidents == [Incident("fp-tier", open=True, triggers=1)]
    [(_, _, _, _, state, attempts, last_error)] = outbox_rows(outbox)
    assert (state, attempts) == ("sent", 4)
    assert last_error.startswith("RemoteProtocolError")  # the drop, the last failure before the 202
    values = {
        r: registry.get_sample_value("shapewatch_notifications_total", {"target": "pd", "result": r})
        for r in ("sent", "retried", "failed")
    }
    assert values == {"sent": 1.0, "retried": 3.0, "failed": 0.0}


def test_a_lost_answer_is_sent_again_with_the_same_dedup_key_and_folds_into_the_incident(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]
) -> None:
    target = pd_target(pager)
    n = notifier([target])
    raise_notices(outbox, [target], [trigger()], T0)
    pager.script(ACCEPT_THEN_DROP)  # the pager opened the incident, the answer never arrived

    assert n.deliver(T0) == DeliveryReport(retried=1)
    assert n.deliver(T0 + timedelta(seconds=1)) == DeliveryReport(sent=1)

    assert pager.bodies()[0] == pager.bodies()[1]
    assert pager.incidents == [Incident("fp-tier", open=True, triggers=2)]


def test_a_restart_sends_nothing_twice_and_delivers_what_was_pending(pager: PagerReceiver, db_path: Path) -> None:
    target = pd_target(pager)
    store = Store.open(db_path, schemas=[NOTIFY_SCHEMA])
    raise_notices(store, [target], [trigger(fingerprint="fp-a"), trigger(fingerprint="fp-b")], T0)
    pager.script(202, 500)
    first = Notifier(store, [target], registry=CollectorRegistry(), backoff_base=0)
    assert first.deliver(T0) == DeliveryReport(sent=1, retried=1)
    # Committed with its alert, never delivered: the process dies right after.
    raise_notices(store, [target], [trigger(fingerprint="fp-c")], T0 + timedelta(seconds=5))
    first.close()
    store.close()

    store = Store.open(db_path, schemas=[NOTIFY_SCHEMA])
    try:
        second = Notifier(store, [target], registry=CollectorRegistry(), backoff_base=0)
        assert second.deliver(T0 + timedelta(minutes=1)) == DeliveryReport(sent=2)
        assert second.deliver(T0 + timedelta(minutes=2)) == DeliveryReport()
        second.close()
        assert [(fp, state) for _, fp, _, _, state, _, _ in outbox_rows(store)] == [
            ("fp-a", "sent"),
            ("fp-b", "sent"),
            ("fp-c", "sent"),
        ]
    finally:
        store.close()
    assert sent_events(pager) == [("trigger", "fp-a"), ("trigger", "fp-b"), ("trigger", "fp-b"), ("trigger", "fp-c")]
    assert pager.incidents == [Incident("fp-a"), Incident("fp-b"), Incident("fp-c")]


def test_a_crash_after_the_pager_accepted_but_before_the_row_was_marked_still_makes_one_incident(
    pager: PagerReceiver, db_path: Path
) -> None:
    target = pd_target(pager)
    store = Store.open(db_path, schemas=[NOTIFY_SCHEMA])
    raise_notices(store, [target], [trigger()], T0)
    first = Notifier(store, [target], registry=CollectorRegistry())
    assert first.deliver(T0) == DeliveryReport(sent=1)
    with store.transaction("simulating a crash between the 202 and marking the row sent") as con:
        con.execute("UPDATE notifications SET state = 'pending', attempts = 0, sent_at = NULL")
    first.close()
    store.close()

    store = Store.open(db_path, schemas=[NOTIFY_SCHEMA])
    try:
        second = Notifier(store, [target], registry=CollectorRegistry())
        assert second.deliver(T0 + timedelta(seconds=30)) == DeliveryReport(sent=1)
        second.close()
    finally:
        store.close()
    assert sent_events(pager) == [("trigger", "fp-tier")] * 2
    assert pager.incidents == [Incident("fp-tier", open=True, triggers=2)]


def test_a_store_error_while_marking_sent_propagates_and_the_resend_is_deduplicated(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = pd_target(pager)
    raise_notices(outbox, [target], [trigger()], T0)
    n = notifier([target])
    real = outbox.transaction

    def failing(doing: str) -> Any:
        if doing == "marking a notification sent":
            raise StoreError(doing, "disk full")
        return real(doing)

    monkeypatch.setattr(outbox, "transaction", failing)
    with pytest.raises(StoreError, match="marking a notification sent"):
        n.deliver(T0)
    monkeypatch.undo()

    assert outbox_rows(outbox)[0][4:6] == ("pending", 0)
    assert n.deliver(T0 + timedelta(seconds=1)) == DeliveryReport(sent=1)
    assert pager.incidents == [Incident("fp-tier", open=True, triggers=2)]


# --- resolve and episodes ----------------------------------------------------------------------


def test_a_resolve_closes_the_incident_and_never_overtakes_its_pending_trigger(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]
) -> None:
    target = pd_target(pager)
    n = notifier([target], backoff_base=60.0)
    raise_notices(outbox, [target], [trigger()], T0)
    pager.script(500)
    assert n.deliver(T0) == DeliveryReport(retried=1)
    [(due,)] = outbox.query("SELECT next_attempt_at FROM notifications WHERE action = 'trigger'")
    assert T0 + timedelta(seconds=30) <= due <= T0 + timedelta(seconds=60)  # 60 s step, equal jitter

    # The condition clears while the trigger still waits for its retry.
    assert raise_notices(outbox, [target], [resolve()], T0 + timedelta(seconds=10)) == 1
    assert n.deliver(T0 + timedelta(seconds=20)) == DeliveryReport()
    assert len(pager.requests) == 1

    assert n.deliver(due) == DeliveryReport(sent=2)
    assert sent_events(pager) == [("trigger", "fp-tier"), ("trigger", "fp-tier"), ("resolve", "fp-tier")]
    assert pager.bodies()[-1] == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": "fp-tier"}
    assert pager.incidents == [Incident("fp-tier", open=False, triggers=1)]


def test_an_alert_that_fires_again_is_a_new_incident_and_waits_for_the_previous_resolve(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]
) -> None:
    target = pd_target(pager)
    n = notifier([target], backoff_base=60.0)
    raise_notices(outbox, [target], [trigger(episode=1)], T0)
    assert n.deliver(T0) == DeliveryReport(sent=1)
    raise_notices(outbox, [target], [resolve(episode=1), trigger(episode=2)], T0 + timedelta(minutes=5))
    pager.script(503)

    assert n.deliver(T0 + timedelta(minutes=5)) == DeliveryReport(retried=1)
    # Episode 2's trigger is due, but sent before the resolve it would fold into the old incident.
    assert n.deliver(T0 + timedelta(minutes=5, seconds=1)) == DeliveryReport()
    assert n.deliver(T0 + timedelta(minutes=10)) == DeliveryReport(sent=2)

    assert sent_events(pager) == [
        ("trigger", "fp-tier"),
        ("resolve", "fp-tier"),
        ("resolve", "fp-tier"),
        ("trigger", "fp-tier"),
    ]
    assert pager.incidents == [Incident("fp-tier", open=False), Incident("fp-tier", open=True)]


def test_trigger_resolve_and_the_next_episode_enqueued_together_go_out_in_order(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]
) -> None:
    target = pd_target(pager)
    raise_notices(outbox, [target], [trigger(episode=1), resolve(episode=1), trigger(episode=2)], T0)
    assert notifier([target]).deliver(T0) == DeliveryReport(sent=3)
    assert [b["event_action"] for b in pager.bodies()] == ["trigger", "resolve", "trigger"]
    assert pager.incidents == [Incident("fp-tier", open=False), Incident("fp-tier", open=True)]


# --- the outbox --------------------------------------------------------------------------------


def test_enqueue_is_idempotent_and_routes_by_severity_and_trigger(outbox: Store) -> None:
    pd = Target("pd", TargetKind.pagerduty, "http://127.0.0.1:9/", routing_key=ROUTING_KEY)
    hook = Target("hook", TargetKind.webhook, "http://127.0.0.1:9/", severities=("page", "warn"))
    targets = [pd, hook]

    assert raise_notices(outbox, targets, [trigger()], T0) == 2
    assert raise_notices(outbox, targets, [trigger()], T0 + timedelta(minutes=5)) == 0  # evaluated again
    assert raise_notices(outbox, targets, [trigger(fingerprint="fp-warn", severity="warn")], T0) == 1
    assert raise_notices(outbox, targets, [resolve(fingerprint="fp-never")], T0) == 0  # no trigger anywhere
    with outbox.transaction("a trigger given up on") as con:
        con.execute("UPDATE notifications SET state = 'failed' WHERE target = 'pd' AND fingerprint = 'fp-tier'")
    assert raise_notices(outbox, targets, [resolve()], T0 + timedelta(hours=1)) == 1  # hook only

    assert [row[:5] for row in outbox_rows(outbox)] == [
        ("hook", "fp-tier", 1, "trigger", "pending"),
        ("hook", "fp-tier", 1, "resolve", "pending"),
        ("hook", "fp-warn", 1, "trigger", "pending"),
        ("pd", "fp-tier", 1, "trigger", "failed"),
    ]


def test_enqueued_notices_roll_back_with_the_alert_transaction(outbox: Store) -> None:
    target = Target("hook", TargetKind.webhook, "http://127.0.0.1:9/")
    with pytest.raises(RuntimeError, match="alert update failed"):
        with outbox.transaction("changing alert state") as con:
            assert enqueue(con, [target], [trigger()], T0) == 1
            raise RuntimeError("alert update failed")
    assert outbox.query("SELECT count(*) FROM notifications") == [(0,)]


def test_rows_of_a_target_no_longer_configured_stay_pending(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    old = Target("old-hook", TargetKind.webhook, pager.url)
    raise_notices(outbox, [old], [trigger()], T0)
    with caplog.at_level(logging.WARNING, logger="shapewatch.analysis.notify"):
        n = notifier([pd_target(pager)])
    assert "1 notifications for target 'old-hook' stay pending" in caplog.text
    assert n.deliver(T0) == DeliveryReport()
    assert pager.requests == []


# --- failures ----------------------------------------------------------------------------------


def test_a_400_is_not_retried_and_is_marked_failed_with_the_error(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier], registry: CollectorRegistry
) -> None:
    target = pd_target(pager)
    n = notifier([target])
    raise_notices(outbox, [target], [trigger()], T0)
    pager.script(Step(400, body='{"status": "invalid event", "errors": ["Event object is invalid"]}'))

    assert n.deliver(T0) == DeliveryReport(failed=1)
    assert n.deliver(T0 + timedelta(hours=1)) == DeliveryReport()

    assert len(pager.requests) == 1 and pager.incidents == []
    assert outbox_rows(outbox) == [
        (
            "pd",
            "fp-tier",
            1,
            "trigger",
            "failed",
            1,
            'HTTP 400: {"status": "invalid event", "errors": ["Event object is invalid"]}',
        )
    ]
    assert registry.get_sample_value("shapewatch_notifications_total", {"target": "pd", "result": "failed"}) == 1.0


def test_retryable_failures_give_up_after_max_attempts(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]
) -> None:
    target = pd_target(pager, max_attempts=3)
    n = notifier([target])
    raise_notices(outbox, [target], [trigger()], T0)
    pager.script(500, 503, 502)
    reports = [n.deliver(T0 + timedelta(seconds=i)) for i in range(4)]
    assert reports == [DeliveryReport(retried=1), DeliveryReport(retried=1), DeliveryReport(failed=1), DeliveryReport()]
    assert outbox_rows(outbox)[0][4:] == (
        "failed",
        3,
        'gave up after 3 attempts: HTTP 502: {"status": "error", "message": "scripted 502"}',
    )


@pytest.mark.parametrize(
    ("retry_after", "wait"),
    [
        ("7", timedelta(seconds=7)),
        (format_datetime(T0 + timedelta(seconds=90), usegmt=True), timedelta(seconds=90)),
    ],
)
def test_retry_after_is_honoured_on_429_and_5xx(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier], retry_after: str, wait: timedelta
) -> None:
    target = pd_target(pager)
    n = notifier([target], backoff_base=1000.0)
    raise_notices(outbox, [target], [trigger()], T0)
    pager.script(Step(429 if retry_after == "7" else 503, {"Retry-After": retry_after}))
    assert n.deliver(T0) == DeliveryReport(retried=1)
    assert outbox.query("SELECT next_attempt_at FROM notifications") == [(T0 + wait,)]
    assert n.deliver(T0 + wait - timedelta(seconds=1)) == DeliveryReport()
    assert n.deliver(T0 + wait) == DeliveryReport(sent=1)
    assert len(pager.incidents) == 1


def test_timeouts_and_refused_connections_are_retried_and_never_raise(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]
) -> None:
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    slow = pd_target(pager, timeout_seconds=0.2)
    gone = Target("gone", TargetKind.webhook, f"http://127.0.0.1:{closed_port}/hook")
    n = notifier([slow, gone])
    raise_notices(outbox, [slow, gone], [trigger()], T0)
    pager.script(HANG)

    assert n.deliver(T0) == DeliveryReport(retried=2)
    errors = {row[0]: row[6] for row in outbox_rows(outbox)}
    assert errors["pd"].startswith("ReadTimeout") and errors["gone"].startswith("ConnectError")
    assert n.deliver(T0 + timedelta(seconds=1)) == DeliveryReport(sent=1, retried=1)
    assert pager.incidents == [Incident("fp-tier")]


# --- wire formats ------------------------------------------------------------------------------


def test_pagerduty_trigger_body(pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]) -> None:
    target = pd_target(pager, severities=("page", "warn"))
    long_detail = "x" * 2000
    raise_notices(
        outbox,
        [target],
        [
            trigger(dashboard_url="http://dash.local/alerts/fp-tier"),
            trigger(fingerprint="fp-long", severity="warn", kind="type_shift", detail=long_detail),
        ],
        T0,
    )
    assert notifier([target]).deliver(T0) == DeliveryReport(sent=2)

    bodies = {b["dedup_key"]: b for b in pager.bodies()}
    first, second = bodies["fp-tier"], bodies["fp-long"]
    assert first == {
        "routing_key": ROUTING_KEY,
        "event_action": "trigger",
        "dedup_key": "fp-tier",
        "payload": {
            "summary": SUMMARY,
            "source": "shapewatch",
            "severity": "critical",
            "component": "customer.tier",
            "group": f"{MODEL}/intake-v3/intake",
            "class": "presence_drop",
            "custom_details": make_alert(),
        },
        "links": [{"href": "http://dash.local/alerts/fp-tier", "text": "shapewatch dashboard"}],
    }
    assert second["payload"]["severity"] == "warning" and second["payload"]["class"] == "type_shift"
    assert len(second["payload"]["summary"]) == 1024 and second["payload"]["summary"].endswith("x…")
    assert pager.requests[0].headers["content-type"] == "application/json"


def test_alertmanager_webhook_bodies(pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]) -> None:
    # The body Alertmanager sends its own webhook receivers (version 4), for a receiver built for it.
    target = Target("am", TargetKind.webhook, pager.url, format="alertmanager-webhook")
    n = notifier([target])
    raise_notices(outbox, [target], [trigger(dashboard_url="http://dash.local/alerts/fp-tier")], T0)
    raise_notices(outbox, [target], [resolve()], T0 + timedelta(hours=1, seconds=30))
    assert n.deliver(T0 + timedelta(hours=2)) == DeliveryReport(sent=2)

    labels = {
        "alertname": "presence_drop",
        "severity": "critical",
        "model": MODEL,
        "prompt_version": "intake-v3",
        "contract": "intake",
        "field": "customer.tier",
        "fingerprint": "fp-tier",
    }
    annotations = {"summary": SUMMARY, "description": "presence 61.0% -> 30.0% (p < 1e-6)"}
    firing, resolved = pager.bodies()
    assert firing == {
        "version": "4",
        "groupKey": '{}:{fingerprint="fp-tier"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "am",
        "groupLabels": {"fingerprint": "fp-tier"},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "http://dash.local/alerts/fp-tier",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": annotations,
                "startsAt": "2026-11-29T12:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://dash.local/alerts/fp-tier",
                "fingerprint": "fp-tier",
            }
        ],
    }
    assert resolved == {
        "version": "4",
        "groupKey": '{}:{fingerprint="fp-tier"}',
        "truncatedAlerts": 0,
        "status": "resolved",
        "receiver": "am",
        "groupLabels": {"fingerprint": "fp-tier"},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [
            {
                "status": "resolved",
                "labels": labels,
                "annotations": annotations,
                "startsAt": "2026-11-29T12:00:00Z",
                "endsAt": "2026-11-29T13:00:30Z",
                "generatorURL": "",
                "fingerprint": "fp-tier",
            }
        ],
    }


def test_alertmanager_api_bodies_and_reposts(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]
) -> None:
    # kind "alertmanager" posts Alertmanager's own API: a list of alerts, a firing one without
    # endsAt, posted again every repeat_seconds while it fires, and ended on resolve.
    target = Target("am", TargetKind.alertmanager, pager.url, repeat_seconds=60)
    n = notifier([target])
    links = {"dashboard": "http://dash.local/field?cohort=1&field=customer.tier", "runbook": "http://sw/v1/runbooks/x"}
    onset = {"at": "2026-11-29T09:10:00Z", "low": "2026-11-29T09:05:00Z", "high": "2026-11-29T09:15:00Z", "method": "m"}
    raise_notices(outbox, [target], [trigger(links=links, onset=onset)], T0)
    assert n.deliver(T0) == DeliveryReport(sent=1)
    labels = {
        "alertname": "ShapewatchPresenceDrop",
        "severity": "critical",
        "model": MODEL,
        "prompt_version": "intake-v3",
        "contract": "intake",
        "fingerprint": "fp-tier",
        "field": "customer.tier",
    }
    firing = {
        "labels": labels,
        "annotations": {
            "summary": SUMMARY,
            "description": "presence 61.0% -> 30.0% (p < 1e-6)",
            "runbook_url": links["runbook"],
            "onset": onset["at"],
        },
        "startsAt": "2026-11-29T12:00:00Z",
        "generatorURL": links["dashboard"],
    }
    assert pager.bodies() == [[firing]]
    assert n.deliver(T0 + timedelta(seconds=30)) == DeliveryReport()  # not yet a repeat
    assert len(pager.requests) == 1
    assert n.deliver(T0 + timedelta(seconds=61)) == DeliveryReport()  # a repeat is no new notification
    assert pager.bodies() == [[firing], [firing]]
    raise_notices(outbox, [target], [resolve(links=links, onset=onset)], T0 + timedelta(minutes=5))
    assert n.deliver(T0 + timedelta(minutes=5)) == DeliveryReport(sent=1)
    assert pager.bodies()[-1] == [{**firing, "endsAt": "2026-11-29T12:05:00Z"}]
    assert all(r.path == "/v2/enqueue" for r in pager.requests)
    assert n.deliver(T0 + timedelta(minutes=10)) == DeliveryReport()
    assert len(pager.requests) == 3  # nothing fires: nothing is re-posted


def test_generic_webhook_body_and_idempotency_key(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier]
) -> None:
    target = Target("hook", TargetKind.webhook, pager.url, headers={"Authorization": "Bearer s3cret"})
    raise_notices(outbox, [target], [trigger(episode=2), resolve(episode=2)], T0)
    assert notifier([target]).deliver(T0) == DeliveryReport(sent=2)

    assert pager.bodies() == [
        {
            "action": "trigger",
            "fingerprint": "fp-tier",
            "episode": 2,
            "severity": "page",
            "summary": SUMMARY,
            "alert": make_alert(),
            "dashboard_url": None,
            "links": {"dashboard": None, "runbook": None},
        },
        {
            "action": "resolve",
            "fingerprint": "fp-tier",
            "episode": 2,
            "severity": "page",
            "summary": SUMMARY,
            "alert": make_alert(state="resolved"),
            "dashboard_url": None,
            "links": {"dashboard": None, "runbook": None},
        },
    ]
    assert [(r.headers["idempotency-key"], r.headers["authorization"]) for r in pager.requests] == [
        ("fp-tier:2:trigger", "Bearer s3cret"),
        ("fp-tier:2:resolve", "Bearer s3cret"),
    ]


def test_summaries_are_one_line_and_secrets_stay_out_of_repr() -> None:
    assert summarize_alert(make_alert()) == SUMMARY
    assert summarize_alert({"kind": "new_field", "field": "a.b", "detail": "first seen\nin 3 outputs"}) == (
        "new_field on a.b: first seen in 3 outputs"
    )
    target = Target(
        "pd",
        TargetKind.pagerduty,
        PAGERDUTY_EVENTS_URL,
        routing_key=ROUTING_KEY,
        headers={"Authorization": "Bearer s3cret"},
    )
    assert ROUTING_KEY not in repr(target) and "s3cret" not in repr(target)


@pytest.mark.parametrize("bad", [{"severity": "info"}, {"episode": 0}, {"fingerprint": ""}])
def test_a_notice_refuses_impossible_values(bad: dict[str, Any]) -> None:
    values: dict[str, Any] = {
        "fingerprint": "fp",
        "episode": 1,
        "action": "trigger",
        "severity": "page",
        "summary": "s",
        "alert": {},
    }
    with pytest.raises(ValueError):
        Notice(**{**values, **bad})


# --- metrics -----------------------------------------------------------------------------------


def test_pending_notifications_are_gauged_at_scrape_time(
    pager: PagerReceiver, outbox: Store, notifier: Callable[..., Notifier], registry: CollectorRegistry
) -> None:
    target = pd_target(pager)
    n = notifier([target], clock=lambda: T0 + timedelta(seconds=30))
    raise_notices(outbox, [target], [trigger(fingerprint="fp-a"), trigger(fingerprint="fp-b")], T0)

    def gauges() -> tuple[float | None, float | None]:
        return (
            registry.get_sample_value("shapewatch_notifications_pending", {"target": "pd"}),
            registry.get_sample_value("shapewatch_notifications_oldest_pending_seconds", {"target": "pd"}),
        )

    assert gauges() == (2.0, 30.0)
    assert n.deliver() == DeliveryReport(sent=2)
    assert gauges() == (0.0, 0.0)


# --- configuration -----------------------------------------------------------------------------


def test_targets_from_config_reads_every_kind() -> None:
    data = {
        "targets": [
            {"name": "pd", "kind": "pagerduty", "routing_key": ROUTING_KEY},
            {
                "name": "am",
                "kind": "alertmanager",
                "url": "http://am.local:9095/hook",
                "severities": ["page", "warn"],
                "timeout_seconds": 2,
                "max_attempts": 3,
            },
            {
                "name": "hook",
                "kind": "webhook",
                "url": "https://hooks.example/x",
                "headers": {"Authorization": "Bearer t"},
            },
        ],
        "digest": {"url": "http://digest.local/daily"},
    }
    assert targets_from_config(data) == [
        Target("pd", TargetKind.pagerduty, PAGERDUTY_EVENTS_URL, routing_key=ROUTING_KEY),
        Target(
            "am",
            TargetKind.alertmanager,
            "http://am.local:9095/hook/api/v2/alerts",  # Alertmanager's address, then its API path
            severities=("page", "warn"),
            timeout_seconds=2.0,
            max_attempts=3,
        ),
        Target("hook", TargetKind.webhook, "https://hooks.example/x", headers={"Authorization": "Bearer t"}),
    ]
    assert digest_url_from_config(data) == "http://digest.local/daily"
    assert targets_from_config({}) == [] and digest_url_from_config({}) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"targets": [{"name": "pd", "kind": "pagerduty"}]},
            'notify.targets[0].routing_key: required for kind "pagerduty"; '
            "set it to the integration key of the PagerDuty service (Events API v2)",
        ),
        (
            {
                "targets": [
                    {"name": "a", "kind": "webhook", "url": "http://x/"},
                    {"name": "a", "kind": "webhook", "url": "http://y/"},
                ]
            },
            "notify.targets[1].name: 'a' is already the name of notify.targets[0]; give each target its own name",
        ),
        (
            {"targets": [{"name": "a", "kind": "slack", "url": "http://x/"}]},
            'notify.targets[0].kind: unknown kind \'slack\'; use one of: "pagerduty", "alertmanager", "webhook"',
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook", "url": "ftp://x/"}]},
            "notify.targets[0].url: 'ftp://x/' is not an http(s) URL; set it to an http:// or https:// URL",
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook"}]},
            "notify.targets[0].url: required, a string; set it to an http:// or https:// URL",
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook", "url": "http://x/", "routing_key": "k"}]},
            'notify.targets[0].routing_key: only used by kind "pagerduty", not "webhook"; remove it',
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook", "url": "http://x/", "severities": ["critical"]}]},
            "notify.targets[0].severities: must be a non-empty list of ['page', 'warn'], not ['critical']; "
            'e.g. severities = ["page"]',
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook", "url": "http://x/", "max_attempts": 0}]},
            "notify.targets[0].max_attempts: must be >= 1, not 0",
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook", "url": "http://x/", "timeout_seconds": True}]},
            "notify.targets[0].timeout_seconds: must be a number, not True",
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook", "url": "http://x/", "retries": 3}]},
            "notify.targets[0].retries: unknown key; use one of: format, headers, kind, max_attempts, name, "
            "repeat_seconds, routing_key, severities, timeout_seconds, url",
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook", "url": "http://x/", "format": "v4"}]},
            "notify.targets[0].format: unknown format 'v4'; use one of: 'shapewatch', 'alertmanager-webhook'",
        ),
        (
            {"targets": [{"name": "a", "kind": "alertmanager", "url": "http://x/", "format": "shapewatch"}]},
            'notify.targets[0].format: only used by kind "webhook", not "alertmanager"; remove it',
        ),
        (
            {"targets": [{"name": "a", "kind": "webhook", "url": "http://x/", "repeat_seconds": 60}]},
            'notify.targets[0].repeat_seconds: only used by kind "alertmanager", not "webhook"; remove it',
        ),
        (
            {"targets": [{"name": "a", "kind": "alertmanager", "url": "http://x/", "repeat_seconds": 0}]},
            "notify.targets[0].repeat_seconds: must be > 0, not 0",
        ),
        (
            {"targets": [{"name": "a", "kind": "alertmanager", "url": "http://x/", "repeat_seconds": 1e12}]},
            "notify.targets[0].repeat_seconds: must be at most 86400, not 1e+12; Alertmanager forgets in minutes",
        ),
        (
            {"targets": [{"kind": "webhook", "url": "http://x/"}]},
            "notify.targets[0].name: required, a non-empty string; "
            'name the target (it labels metrics and the outbox rows), e.g. name = "pd"',
        ),
        (
            {"targets": {"name": "a"}},
            "notify.targets: must be an array of tables; write each target as a [[notify.targets]] table",
        ),
        ({"target": []}, "notify.target: unknown key; use one of: digest, targets"),
    ],
)
def test_targets_from_config_names_the_key_and_the_fix(data: dict[str, Any], message: str) -> None:
    with pytest.raises(NotifyConfigInvalid) as err:
        targets_from_config(data)
    assert str(err.value) == message


def test_digest_config_errors() -> None:
    with pytest.raises(NotifyConfigInvalid, match=r"^notify\.digest\.url: required, a string"):
        digest_url_from_config({"digest": {}})
    with pytest.raises(NotifyConfigInvalid, match=r"^notify\.digest\.hour: unknown key"):
        digest_url_from_config({"digest": {"url": "http://x/", "hour": 9}})


# --- the daily digest --------------------------------------------------------------------------


def test_send_digest_retries_then_delivers_one_body(pager: PagerReceiver) -> None:
    warn = [make_alert(fingerprint="fp-w", severity="warn", kind="new_enum_value", field="priority")]
    pauses: list[float] = []
    pager.script(500, Step(429, {"Retry-After": "2"}), 200)
    with httpx.Client() as client:
        assert (
            send_digest(client, pager.url, warn, T0, backoff_base=1.0, sleep=pauses.append, rng=random.Random(1))
            is True
        )
    assert [r.answer for r in pager.requests] == [500, 429, 200]
    assert 0.5 <= pauses[0] <= 1.0 and pauses[1] == 2.0
    assert pager.bodies() == [{"kind": "digest", "generated_at": "2026-11-29T12:00:00Z", "alerts": warn}] * 3
    assert pager.requests[0].headers["idempotency-key"] == "digest:2026-11-29"


def test_send_digest_gives_up_without_raising(pager: PagerReceiver) -> None:
    pauses: list[float] = []
    with httpx.Client() as client:
        pager.script(400)
        assert send_digest(client, pager.url, [], T0, sleep=pauses.append) is False
        assert len(pager.requests) == 1  # a 400 is final
        pager.script(500, DROP)
        assert send_digest(client, pager.url, [], T0, attempts=2, backoff_base=0, sleep=pauses.append) is False
    assert [r.answer for r in pager.requests] == [400, 500, DROP]
    assert pauses == [0.0]
