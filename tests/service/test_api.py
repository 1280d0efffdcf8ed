"""REST API v1 semantics against a standalone service subprocess, over real HTTP."""

from __future__ import annotations

import http.client
import json
import threading
import time
from datetime import datetime, timezone

import pytest

from .conftest import ALICE, BOB, CAROL, DAVE, ROOT

MIG = {"kind": "mig", "profile": "1g.5gb"}
WHOLE_L4 = {"kind": "whole", "model": "L4"}


def grant(service, token, spec=MIG, holder="kernel:k1", **extra):
    response = service.call("POST", "leases", {"spec": spec, "holder": holder, **extra}, token)
    assert response.status == 201, response
    return response.json()


def l4_uuids(service):
    gpus = service.call("GET", "inventory", token=ROOT).json()["nodes"][0]["gpus"]
    return [g["uuid"] for g in gpus if g["model"] == "L4"]


def test_health_needs_no_token_and_the_rest_does(service):
    health = service.call("GET", "health")
    assert health.status == 200 and health.json()["status"] == "ok" and health.json()["gpus"] == 4
    for method, path in [("GET", "inventory"), ("GET", "offers"), ("GET", "leases"), ("POST", "leases"),
                         ("GET", "leases/x"), ("DELETE", "leases/x"), ("POST", "leases/x/touch"),
                         ("POST", "heartbeat"), ("GET", "events"), ("GET", "metrics"),
                         ("POST", "gpus/x/drain"), ("GET", "user")]:
        for token in (None, "not-a-known-token"):
            response = service.call(method, path, {} if method == "POST" else None, token)
            assert response.status == 401, (method, path, response)
            assert "error" in response.json() and response.headers["WWW-Authenticate"].startswith("Bearer")


def test_whoami_and_unknown_endpoint(service):
    assert service.call("GET", "user", token=BOB).json() == {"user": "bob", "admin": False, "groups": ["students"]}
    assert service.call("GET", "user", token=ROOT).json()["admin"] is True
    missing = service.call("GET", "no-such-thing", token=ALICE)
    assert missing.status == 404 and "no such endpoint" in missing.json()["error"]


def test_inventory_and_offers(service):
    inventory = service.call("GET", "inventory", token=ALICE).json()
    gpus = inventory["nodes"][0]["gpus"]
    assert [g["model"] for g in gpus] == ["A100-SXM4-40GB"] * 2 + ["L4"] * 2
    assert all(g["free_profiles"]["1g.5gb"] == 7 for g in gpus[:2])
    offers = service.call("GET", "offers", token=ALICE).json()["offers"]
    by_spec = {json.dumps(o["spec"], sort_keys=True): o for o in offers}
    mig_offer = [o for o in offers if o["spec"].get("profile") == "1g.5gb"]
    assert mig_offer and mig_offer[0]["available"] == 14
    assert any(o["spec"]["kind"] == "whole" and o["available"] == 2 for o in by_spec.values())


def test_grant_get_release(service):
    lease = grant(service, ALICE)
    assert lease["state"] == "granted" and lease["user"] == "alice" and lease["position"] is None
    assert lease["slice"]["kind"] == "mig" and lease["slice"]["visible_devices"].startswith("MIG-")
    got = service.call("GET", f"leases/{lease['id']}", token=ALICE).json()
    assert got["slice"] == lease["slice"]
    assert [l["id"] for l in service.call("GET", "leases", token=ALICE).json()["leases"]] == [lease["id"]]
    released = service.call("DELETE", f"leases/{lease['id']}", token=ALICE)
    assert released.status == 200 and released.json()["state"] == "released"
    again = service.call("DELETE", f"leases/{lease['id']}", token=ALICE)
    assert again.status == 404 and again.json()["state"] == "released"
    assert service.call("GET", f"leases/{lease['id']}", token=ALICE).json()["state"] == "released"
    assert service.call("GET", "leases/0123456789abcdef", token=ALICE).status == 404


def test_queue_positions_reject_and_long_poll(service):
    first = grant(service, ALICE, WHOLE_L4, "job:1")
    grant(service, ALICE, WHOLE_L4, "job:2")
    queued = service.call("POST", "leases", {"spec": WHOLE_L4, "holder": "job:3"}, BOB)
    assert queued.status == 202 and queued.json()["state"] == "queued" and queued.json()["position"] == 1
    assert queued.headers["Location"].endswith(f"/api/v1/leases/{queued.json()['id']}")
    rejected = service.call("POST", "leases", {"spec": WHOLE_L4, "holder": "job:4", "wait": 0}, DAVE)
    assert rejected.status == 409 and rejected.json()["reason"].startswith("no capacity")
    started = time.monotonic()
    timed_out = service.call("POST", "leases", {"spec": WHOLE_L4, "holder": "job:5", "wait": 0.5}, DAVE)
    assert timed_out.status == 202 and timed_out.json()["position"] == 2
    assert 0.45 <= time.monotonic() - started < 5

    answers = {}

    def long_poll():
        answers["poll"] = service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"},
                                                         "holder": "job:6", "wait": 10}, CAROL)

    # the long poll for a MIG slice is granted at once; one for an L4 waits for a release
    long_poll()
    assert answers["poll"].status == 201
    waiter = threading.Thread(target=lambda: answers.update(
        l4=service.call("POST", "leases", {"spec": WHOLE_L4, "holder": "job:7", "wait": 20}, ALICE)))
    service.call("DELETE", f"leases/{queued.json()['id']}", token=BOB)
    service.call("DELETE", f"leases/{timed_out.json()['id']}", token=DAVE)
    waiter.start()
    time.sleep(0.5)
    assert "l4" not in answers
    started = time.monotonic()
    service.call("DELETE", f"leases/{first['id']}", token=ALICE)
    waiter.join(10)
    assert answers["l4"].status == 201 and answers["l4"].json()["state"] == "granted"
    assert time.monotonic() - started < 2


def test_quota_holder_busy_and_input_errors(service):
    grant(service, CAROL)
    over = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:k2"}, CAROL)
    assert over.status == 403
    assert over.json()["quota"] == {"scope": "user", "key": "slices", "limit": 1}
    busy = service.call("POST", "leases", {"spec": MIG, "holder": "kernel:k1"}, CAROL)
    assert busy.status == 409 and busy.json()["lease_id"]
    cases = [
        ({"spec": {"kind": "shared"}, "holder": "kernel:x"}, "spec.memory_gib"),
        ({"spec": {"memory_gib": -1}, "holder": "kernel:x"}, "spec.memory_gib"),
        ({"spec": {"colour": "red"}, "holder": "kernel:x"}, "spec.colour"),
        ({"spec": "big", "holder": "kernel:x"}, "spec"),
        ({"spec": {"profile": "9g.99gb"}, "holder": "kernel:x"}, "spec.profile"),
        ({"holder": "kernel:x"}, "offer"),
        ({"spec": MIG, "offer": "whole-l4", "holder": "kernel:x"}, "offer"),
        ({"offer": "no-such-offer", "holder": "kernel:x"}, "offer"),
        ({"spec": MIG, "holder": "kernel:x", "idle_timeout": 0}, "idle_timeout"),
        ({"spec": MIG, "holder": "kernel:x", "idle_timeout": -1}, "idle_timeout"),
        ({"spec": MIG}, "holder"),
        ({"spec": MIG, "holder": "laptop"}, "holder"),
        ({"spec": MIG, "holder": "kernel:x", "priority": "urgent"}, "priority"),
        ({"spec": MIG, "holder": "kernel:x", "wait": -1}, "wait"),
        ({"spec": MIG, "holder": "kernel:x", "wait": True}, "wait"),
        ({"spec": MIG, "holder": "kernel:x", "preemptible": "yes"}, "preemptible"),
        ({"spec": MIG, "holder": "kernel:x", "idle_timeout": "soon"}, "idle_timeout"),
        ({"spec": MIG, "holder": "kernel:x", "groups": ["admins"]}, "groups"),
        ({"spec": MIG, "holder": "kernel:x", "user": "bob"}, "user"),
    ]
    for body, field in cases:
        response = service.call("POST", "leases", body, ALICE)
        assert response.status == 400, (body, response)
        assert response.json()["field"] == field, (body, response)
    for raw in (b"{", b"[1, 2]", b"\xff\xfe", b'"text"', b"null"):
        response = service.call("POST", "leases", raw=raw, token=ALICE)
        assert response.status == 400 and response.json()["field"] == "body", (raw, response)
    assert service.call("POST", "leases", raw=b"x" * 70000, token=ALICE).status == 413


def test_drain_makes_503_with_retry_after_and_is_admin_only(service):
    uuids = l4_uuids(service)
    assert service.call("POST", f"gpus/{uuids[0]}/drain", token=ALICE).status == 403
    assert service.call("POST", "gpus/GPU-nope/drain", token=ROOT).status == 404
    for uuid in uuids:
        answer = service.call("POST", f"gpus/{uuid}/drain", token=ROOT)
        assert answer.status == 200 and answer.json() == {"gpu": uuid, "drained": True}
    drained = service.call("POST", "leases", {"spec": WHOLE_L4, "holder": "job:1", "wait": 0}, ALICE)
    assert drained.status == 503 and drained.headers["Retry-After"] == "30"
    assert drained.json()["reason"].startswith("drained")
    assert service.call("DELETE", f"gpus/{uuids[0]}/drain", token=BOB).status == 403
    assert service.call("DELETE", f"gpus/{uuids[0]}/drain", token=ROOT).json()["drained"] is False
    grant(service, ALICE, WHOLE_L4, "job:1")


def test_users_cannot_see_or_act_on_other_users_leases(service):
    lease = grant(service, ALICE)
    path = f"leases/{lease['id']}"
    assert service.call("GET", path, token=BOB).status == 404
    assert service.call("DELETE", path, token=BOB).status == 404
    assert service.call("POST", path + "/touch", {"busy": True}, BOB).status == 404
    assert service.call("GET", "leases", token=BOB).json()["leases"] == []
    assert service.call("POST", "heartbeat", {}, BOB).json()["leases"] == []
    assert service.call("GET", "leases?all=1", token=BOB).status == 403
    assert service.call("GET", "metrics", token=BOB).status == 403
    gpus = service.call("GET", "inventory", token=BOB).json()["nodes"][0]["gpus"]
    owners = [i["lease_id"] for g in gpus[:2] for i in g["instances"] if i["lease_id"]]
    assert owners == ["other"]
    assert service.call("GET", path, token=ALICE).json()["state"] == "granted"
    # the admin sees and releases anyone's lease
    assert [l["id"] for l in service.call("GET", "leases?all=1", token=ROOT).json()["leases"]] == [lease["id"]]
    assert service.call("GET", path, token=ROOT).status == 200
    assert service.call("DELETE", path, token=ROOT).json()["reason"] == "released by root"


def test_a_lease_gets_the_idle_timeout_of_the_admins_policy_whatever_the_request_says(fresh_service):
    """The admin's idle_timeout = 4, idle_grace = 2: a request asking for no idle release (0) is
    refused, one asking for a longer timeout gets the policy's and is released after 6 s like
    any other; a shorter one is honoured; an offer asked by name gets the offer's terms."""
    svc = fresh_service(config="c.SchedulerPolicy.idle_timeout = 4\nc.SchedulerPolicy.idle_grace = 2\n"
                               "c.SchedulerPolicy.heartbeat_ttl = 3600\nc.SchedulerPolicy.wait_for_holders = False\n"
                               "c.SchedulerPolicy.offers = [{'name': 'small', 'spec': {'kind': 'mig', 'profile': "
                               "'1g.5gb'}, 'idle_timeout': 3, 'max_duration': 600}]\n").start()
    refused = svc.call("POST", "leases", {"spec": WHOLE_L4, "holder": "kernel:k0", "idle_timeout": 0}, ALICE)
    assert refused.status == 400 and refused.json()["field"] == "idle_timeout"
    longer = grant(svc, ALICE, WHOLE_L4, "kernel:k1", idle_timeout=10_000_000)
    plain = grant(svc, BOB, {"kind": "shared", "memory_gib": 4, "model": "L4"}, "kernel:k2")
    shorter = grant(svc, CAROL, {"kind": "shared", "memory_gib": 2, "model": "L4"}, "kernel:k3", idle_timeout=1)
    named = svc.call("POST", "leases", {"offer": "small", "holder": "kernel:k4", "idle_timeout": 100}, DAVE).json()
    assert (longer["idle_timeout"], plain["idle_timeout"], shorter["idle_timeout"]) == (4, 4, 1)
    assert named["spec"]["profile"] == "1g.5gb" and named["idle_timeout"] == 3 and named["deadline"] is not None
    deadline = time.monotonic() + 30
    states = {}
    while time.monotonic() < deadline:
        states = {l["holder"]: l["state"] for l in svc.call("GET", "leases?all=1", token=ROOT).json()["leases"]}
        if not states:
            break
        time.sleep(0.5)
    assert states == {}, f"still held after 30 s: {states}"


def test_touch_and_heartbeat(service):
    lease = grant(service, ALICE, idle_timeout=600)
    path = f"leases/{lease['id']}/touch"
    time.sleep(0.3)
    moment = time.time() - 0.1
    iso = datetime.fromtimestamp(moment, timezone.utc).isoformat()
    touched = service.call("POST", path, {"last_activity": iso, "busy": True, "connections": 1}, ALICE).json()
    assert touched["busy"] is True and abs(touched["last_activity"] - moment) < 1e-3
    earlier = service.call("POST", path, {"last_activity": moment - 10, "busy": False}, ALICE).json()
    assert abs(earlier["last_activity"] - moment) < 1e-3 and earlier["busy"] is False
    future = service.call("POST", path, {"last_activity": moment + 3600}, ALICE).json()
    assert moment < future["last_activity"] <= time.time()
    assert service.call("POST", path, {}, ALICE).status == 200
    # a time in the document's years that its offset takes before 1970 counts as 1970, not a refusal
    # (earlier than the activity known, it moves nothing)
    known = service.call("GET", f"leases/{lease['id']}", token=ALICE).json()["last_activity"]
    edge = service.call("POST", path, {"last_activity": "1970-01-01T00:00:00+01:00"}, ALICE)
    assert edge.status == 200 and edge.json()["last_activity"] == known, edge
    for body, field in [({"last_activity": "yesterday"}, "last_activity"), ({"busy": 1}, "busy"),
                        ({"connections": -1}, "connections"), ({"connections": 1.5}, "connections"),
                        ({"last_activity": "0270-05-23T04:05:50Z"}, "last_activity"),
                        ({"cpu": 3}, "cpu")]:
        response = service.call("POST", path, body, ALICE)
        assert response.status == 400 and response.json()["field"] == field, (body, response)
    beat = service.call("POST", "heartbeat", {"holders": ["kernel:k1"]}, ALICE).json()["leases"]
    assert [l["id"] for l in beat] == [lease["id"]]
    assert service.call("POST", "heartbeat", {"holders": ["kernel:other"]}, ALICE).json()["leases"] == []
    assert service.call("POST", "heartbeat", {"holders": "kernel:k1"}, ALICE).json()["field"] == "holders"
    service.call("DELETE", f"leases/{lease['id']}", token=ALICE)
    assert service.call("POST", path, {}, ALICE).status == 404


def read_events(service, token, count, timeout=10, query=""):
    """Open GET /events and return (connection, function reading the next `count` data messages)."""
    conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=timeout)
    conn.request("GET", "/api/v1/events" + query, headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    assert response.readline() == b": connected\n"

    def take() -> list[dict]:
        events = []
        while len(events) < count:
            line = response.readline()
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
        return events

    return conn, take


def test_event_streams_show_own_leases_and_fleet_events(service):
    bob_conn, bob_events = read_events(service, BOB, 3, query="?fleet=1")
    root_conn, root_events = read_events(service, ROOT, 4)
    time.sleep(0.2)
    alice_lease = grant(service, ALICE, {"kind": "shared", "memory_gib": 4, "model": "L4"})
    uuid = l4_uuids(service)[1]
    service.call("POST", f"gpus/{uuid}/drain", token=ROOT)
    bob_lease = grant(service, BOB)
    service.call("DELETE", f"leases/{bob_lease['id']}", token=BOB)
    seen_by_bob = bob_events()
    assert [(e["type"], e["lease_id"]) for e in seen_by_bob] == [
        ("gpu.drained", None), ("lease.granted", bob_lease["id"]), ("lease.released", bob_lease["id"])]
    assert seen_by_bob[0]["data"]["gpu"] == uuid
    seen_by_root = root_events()
    assert [e["type"] for e in seen_by_root] == ["lease.granted", "gpu.drained", "lease.granted", "lease.released"]
    assert seen_by_root[0]["lease_id"] == alice_lease["id"]
    bob_conn.close()
    root_conn.close()
    lines = [json.loads(line) for line in service.audit_log.read_text().splitlines()]
    assert {"lease.granted", "lease.released", "gpu.drained"} <= {e["type"] for e in lines}
    assert any(e["lease_id"] == alice_lease["id"] and e["type"] == "lease.granted" for e in lines)


def test_metrics_for_admins(service):
    grant(service, ALICE)
    queued = [grant(service, ALICE, WHOLE_L4, f"job:{n}") for n in range(2)]
    service.call("POST", "leases", {"spec": WHOLE_L4, "holder": "job:9", "priority": "batch"}, BOB)
    text = service.call("GET", "metrics", token=ROOT)
    assert text.status == 200 and text.headers["Content-Type"].startswith("text/plain")
    body = text.text
    assert 'gpualloc_gpus{drained="false",mig_mode="static",model="A100-SXM4-40GB",node="node0"} 2.0' in body
    assert 'gpualloc_slices{kind="mig",model="A100-SXM4-40GB",profile="1g.5gb",state="granted"} 1.0' in body
    assert 'gpualloc_slices{kind="mig",model="A100-SXM4-40GB",profile="1g.5gb",state="free"} 13.0' in body
    assert 'gpualloc_slices{kind="whole",model="L4",profile="",state="granted"} 2.0' in body
    assert 'gpualloc_leases{state="queued"} 1.0' in body and 'gpualloc_leases{state="granted"} 3.0' in body
    assert 'gpualloc_queue_length{priority="batch"} 1.0' in body
    assert 'gpualloc_queue_wait_seconds_count{priority="interactive"}' in body
    assert 'gpualloc_decision_seconds_count{operation="submit"}' in body
    assert "gpualloc_lease_expirations_total 0.0" in body and "gpualloc_lease_preemptions_total" in body
    assert queued


@pytest.mark.parametrize("method,path", [("POST", "leases"), ("POST", "heartbeat"), ("POST", "leases/ID/touch")])
def test_odd_json_never_gets_a_500(service, method, path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    lease = grant(service, DAVE, holder="kernel:fuzz")
    path = path.replace("ID", lease["id"])
    scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
    keys = st.sampled_from(["spec", "holder", "priority", "wait", "preemptible", "idle_timeout", "holders",
                            "last_activity", "busy", "connections", "kind", "x"])
    spec_keys = st.sampled_from(["kind", "memory_gib", "memory_mib", "profile", "model", "count", "node",
                                 "cpu_milli", "host_memory_mib"])
    specs = st.dictionaries(spec_keys, values, max_size=4)
    bodies = st.dictionaries(keys, values | specs, max_size=5) | values

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(bodies)
    def check(body):
        raw = json.dumps(body, allow_nan=True).encode()
        response = service.call(method, path, raw=raw, token=DAVE)
        assert response.status < 500, (body, response)
        if response.status >= 400:
            assert isinstance(response.json()["error"], str)
        elif response.status in (201, 202) and path == "leases":
            service.call("DELETE", f"leases/{response.json()['id']}", token=DAVE)

    check()
