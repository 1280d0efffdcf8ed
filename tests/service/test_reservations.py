"""REST API v1 for reservations (issue 27): admins create and delete, members see theirs, errors name the field."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timezone

from .conftest import ALICE, BOB, DAVE, ROOT
from .test_openapi import validator

MIG = {"kind": "mig", "profile": "1g.5gb"}


def body(**fields):
    now = time.time()
    return {"name": "ml101", "groups": ["students"], "spec": MIG, "count": 7, "start": now - 60,
            "end": now + 3600, **fields}


def test_reservations_over_rest_survive_a_restart(fresh_service):
    svc = fresh_service().start()
    assert svc.call("POST", "reservations", body(), ALICE).status == 403
    too_many = svc.call("POST", "reservations", body(count=15), ROOT)
    assert too_many.status == 409 and too_many.json()["field"] == "count" and too_many.json()["fits"] == 14
    assert "only 14 of 15" in too_many.json()["error"]
    for fields, field in [({"groups": []}, "groups"), ({"start": "next tuesday"}, "start"), ({"color": 1}, "color")]:
        bad = svc.call("POST", "reservations", body(**fields), ROOT)
        assert bad.status == 400 and bad.json()["field"] == field, bad
    created = svc.call("POST", "reservations", body(), ROOT)
    assert created.status == 201, created
    assert created.headers["Location"].endswith("/api/v1/reservations/ml101")
    data = created.json()
    assert data["state"] == "active" and data["free"] == 7 and data["warnings"] == [] and len(data["held"]) == 1
    document = svc.call("GET", "openapi.json").json()
    validator(document, "Reservation").validate(data)
    validator(document, "Error").validate(too_many.json())
    listed = svc.call("GET", "reservations", token=BOB).json()
    validator(document, "ReservationList").validate(listed)
    assert [r["name"] for r in listed["reservations"]] == ["ml101"]
    assert svc.call("GET", "reservations", token=ALICE).json()["reservations"] == []
    assert svc.call("GET", "reservations/ml101", token=ALICE).status == 404
    outside = [svc.call("POST", "leases", {"spec": MIG, "holder": f"kernel:a{i}"}, ALICE).json() for i in range(8)]
    assert [l["state"] for l in outside] == ["granted"] * 7 + ["queued"]
    member = svc.call("POST", "leases", {"spec": MIG, "holder": "server"}, BOB).json()
    assert member["state"] == "granted" and member["deadline"]["at"] == data["next_end"]
    svc.kill()
    svc.start()
    again = svc.call("GET", "reservations/ml101", token=BOB).json()
    assert again["in_use"] == 1 and again["free"] == 6 and again["summary"].startswith("ml101 reservation: 6 of 7 free")
    usage = svc.call("GET", "usage?by=reservation", token=ROOT).json()
    assert [(r["reservation"], r["leases"]) for r in usage["rows"]] == [("ml101", 1)]
    validator(document, "UsageReport").validate(usage)
    assert svc.call("DELETE", "reservations/ml101", token=BOB).status == 403
    assert svc.call("DELETE", "reservations/ml101", token=ROOT).status == 200
    assert svc.call("GET", "reservations/ml101", token=ROOT).status == 404
    types = [json.loads(line)["type"] for line in svc.audit_log.read_text().splitlines()]
    assert "reservation.created" in types and "reservation.deleted" in types


def cli(svc, token, *args):
    return subprocess.run([sys.executable, "-m", "jupyter_gpualloc.cli", "reservation", *args, "--url", svc.url[: -len("api/v1/")],
                           "--token", token], capture_output=True, text=True, timeout=60)


def test_the_reservation_command(fresh_service):
    svc = fresh_service().start()
    start = datetime.fromtimestamp(time.time() + 86400, timezone.utc).strftime("%Y-%m-%dT%H:%M")
    made = cli(svc, ROOT, "create", "ml101", "--group", "students", "--mig", "1g.5gb", "--count", "7",
               "--start", start, "--duration", "2h", "--weekly")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("ml101 reservation: 7 1g.5gb slices from ")
    refused = cli(svc, ROOT, "create", "ml102", "--user", "alice", "--mig", "1g.5gb", "--count", "8",
                  "--start", start, "--duration", "1h")
    assert refused.returncode == 1 and "only 7 of 8" in refused.stderr
    listed = cli(svc, BOB, "list")
    assert listed.returncode == 0 and listed.stdout.startswith("ml101  upcoming  7 x 1g.5gb slice for group students")
    assert "weekly  in use 0/7" in listed.stdout
    assert cli(svc, ALICE, "list").stdout == "no reservations\n"
    assert cli(svc, ALICE, "delete", "ml101").returncode == 1
    assert cli(svc, ROOT, "delete", "ml101").stdout == "deleted ml101\n"


def test_a_window_out_of_range_is_refused_naming_its_field_and_nothing_is_stored(fresh_service):
    """An admin's typo, milliseconds for seconds (Date.now()), a date before 1970 or past year 9999: 400
    naming the field, nothing stored, the list still readable and the scheduler's rules all working."""
    svc = fresh_service().start()
    for fields, field in [({"start": -1e11}, "start"), ({"end": time.time() * 1000}, "end"),
                          ({"start": "0001-01-01T00:00"}, "start"), ({"end": "9999-12-31T23:00-05:00"}, "end")]:
        bad = svc.call("POST", "reservations", body(**fields), ROOT)
        assert bad.status == 400 and bad.json()["field"] == field, (fields, bad)
    listed = svc.call("GET", "reservations", token=ROOT)
    assert listed.status == 200 and listed.json()["reservations"] == []
    assert svc.call("GET", "health").json()["broken_rules"] == []


def test_a_member_sees_no_other_members_names_nor_their_lease_ids(fresh_service):
    """Names and lease ids of other members read 'other', as in the inventory; the admin sees them all."""
    svc = fresh_service().start()
    made = svc.call("POST", "reservations", body(users=["bob", "dave"], groups=["students", "staff"]), ROOT)
    assert made.status == 201, made
    bob = svc.call("POST", "leases", {"spec": MIG, "holder": "server"}, BOB).json()
    dave = svc.call("POST", "leases", {"spec": MIG, "holder": "server"}, DAVE).json()
    assert bob["reservation"] == dave["reservation"] == "ml101"
    document = svc.call("GET", "openapi.json").json()
    as_bob = svc.call("GET", "reservations/ml101", token=BOB).json()
    assert as_bob["users"] == ["bob", "other"] and as_bob["groups"] == ["students", "other"]
    assert sorted(as_bob["leases"]) == sorted([bob["id"], "other"]) and as_bob["in_use"] == 2
    validator(document, "Reservation").validate(as_bob)
    [as_dave] = svc.call("GET", "reservations", token=DAVE).json()["reservations"]
    assert as_dave["users"] == ["other", "dave"] and as_dave["groups"] == ["other", "other"]
    assert sorted(as_dave["leases"]) == sorted([dave["id"], "other"])
    as_root = svc.call("GET", "reservations/ml101", token=ROOT).json()
    assert as_root["users"] == ["bob", "dave"] and as_root["groups"] == ["students", "staff"]
    assert sorted(as_root["leases"]) == sorted([bob["id"], dave["id"]])


def test_a_corrupt_reservation_is_shown_and_counted_while_every_other_rule_goes_on(fresh_service):
    """A row stored before windows were bounded (its start before year 1) breaks its own rule of
    the tick only: /health lists it (without its name), the metric counts it, leases are still
    granted and expired, and once it is deleted the tick is whole again."""
    from jupyter_gpualloc.core.model import SliceSpec
    from jupyter_gpualloc.core.reservations import Reservation
    from jupyter_gpualloc.core.store import Store

    svc = fresh_service(args=("--tick-interval", "0.2"),
                        config=POLICY_SHORT_TTL)
    store = Store(svc.db)
    store.save_reservations([Reservation("typo", "root", ("bob",), (), SliceSpec.from_json(MIG), 1, -1e11,
                                         time.time() + 3600)])
    store.close()
    svc.start()
    deadline = time.time() + 20
    while not (health := svc.call("GET", "health").json())["broken_rules"] and time.time() < deadline:
        time.sleep(0.2)
    assert [b["rule"] for b in health["broken_rules"]] == ["reservation"], health
    metrics = svc.call("GET", "metrics", token=ROOT).text
    assert 'gpualloc_tick_errors_total{rule="reservation typo"}' in metrics
    assert "gpualloc_tick_rules_broken 1.0" in metrics
    listed = svc.call("GET", "reservations", token=ROOT).json()["reservations"]
    assert [r["name"] for r in listed] == ["typo"]
    silent = svc.call("POST", "leases", {"spec": MIG, "holder": "kernel:silent"}, ALICE).json()
    assert silent["state"] == "granted"
    while svc.call("GET", f"leases/{silent['id']}", token=ALICE).json()["state"] == "granted" \
            and time.time() < deadline + 10:
        time.sleep(0.2)
    assert svc.call("GET", f"leases/{silent['id']}", token=ALICE).json()["state"] == "expired"  # no heartbeat
    assert svc.call("DELETE", "reservations/typo", token=ROOT).status == 200
    time.sleep(1)
    assert svc.call("GET", "health").json()["broken_rules"] == []
    assert (svc.workdir / "service.log").read_text().count("rule 'reservation typo' failed") == 1  # not every tick


POLICY_SHORT_TTL = """
c.SchedulerPolicy.heartbeat_ttl = 2
c.SchedulerPolicy.wait_for_holders = False
"""
