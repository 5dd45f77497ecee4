"""A reply to a batch lists at most MAX_REJECTIONS_LISTED rejected events in full; every rejection
is still counted, by reason. (A 12 MB array of 150,000 invalid envelopes got a 164 MB reply.)"""

from __future__ import annotations

import json

import httpx
import pytest
from harness import Service, make_envelope

from shapewatch.collector.api import MAX_REJECTIONS_LISTED


def _body(ndjson: bool, items: list[dict[str, object]]) -> tuple[bytes, str]:
    if ndjson:
        return b"\n".join(json.dumps(i).encode() for i in items), "application/x-ndjson"
    return json.dumps(items).encode(), "application/json"


@pytest.mark.slow
@pytest.mark.parametrize("ndjson", [False, True], ids=["array", "ndjson"])
def test_a_batch_of_invalid_envelopes_gets_a_bounded_reply(service: Service, ndjson: bool) -> None:
    valid = [make_envelope(), make_envelope()]
    missing = [make_envelope(model=None) for _ in range(1500)]
    bad_output = [make_envelope(output=[1]) for _ in range(1500)]
    items: list[dict[str, object]] = [valid[0], *missing, *bad_output, valid[1]]
    body, ctype = _body(ndjson, items)
    with httpx.Client(base_url=service.url, timeout=60) as c:
        r = c.post("/v1/outputs", content=body, headers={"content-type": ctype})
        assert r.status_code == 200, r.text
        reply = r.json()
        listed = [x for x in reply["results"] if x["status"] == "rejected"]
        assert len(listed) == MAX_REJECTIONS_LISTED
        # the first rejections, in order, whole
        where = (lambda i: f"line {i + 1}: ") if ndjson else (lambda i: "")
        assert listed[:2] == [
            {
                "index": 1,
                "event_id": missing[0]["event_id"],
                "status": "rejected",
                "errors": [{"path": "model", "reason": f"{where(1)}is required"}],
            },
            {
                "index": 2,
                "event_id": missing[1]["event_id"],
                "status": "rejected",
                "errors": [{"path": "model", "reason": f"{where(2)}is required"}],
            },
        ]
        assert [x["index"] for x in listed] == list(range(1, MAX_REJECTIONS_LISTED + 1))
        assert [x for x in reply["results"] if x["status"] != "rejected"] == [
            {"index": 0, "event_id": valid[0]["event_id"], "status": "accepted"},
            {"index": 3001, "event_id": valid[1]["event_id"], "status": "accepted"},
        ]
        assert {k: v for k, v in reply.items() if k != "results"} == {
            "accepted": 2,
            "duplicate": 0,
            "rejected": 3000,
            "rejected_by_reason": {"missing": 1500, "wrong_type": 1500},
            "rejections_omitted": 3000 - MAX_REJECTIONS_LISTED,
        }
        assert len(r.content) < 30_000
        stored = c.get("/v1/events", params={"ids": [v["event_id"] for v in valid]})
        assert sorted(e["event_id"] for e in stored.json()) == sorted(v["event_id"] for v in valid)


def test_conflicts_beyond_the_cap_are_counted_not_listed(service: Service) -> None:
    first = [make_envelope() for _ in range(MAX_REJECTIONS_LISTED + 20)]
    with httpx.Client(base_url=service.url, timeout=60) as c:
        assert c.post("/v1/outputs", json=first).json()["accepted"] == len(first)
        reused = [{**e, "output": {"intent": "other"}} for e in first]
        reply = c.post("/v1/outputs", json=[make_envelope(model=None), *reused]).json()
    assert (reply["accepted"], reply["rejected"], reply["rejected_by_reason"], reply["rejections_omitted"]) == (
        0,
        len(first) + 1,
        {"conflict": len(first), "missing": 1},
        21,
    )
    assert len(reply["results"]) == MAX_REJECTIONS_LISTED
    assert reply["results"][1] == {
        "index": 1,
        "event_id": first[0]["event_id"],
        "status": "rejected",
        "errors": [
            {
                "path": "event_id",
                "reason": "already stored with a different payload; an event_id names one event and must not be reused",
            }
        ],
    }
