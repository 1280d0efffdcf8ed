"""REST API v1 for reservations (issue 27): admins create and delete, members see theirs, errors name the field."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timezone

from .conftest import ALICE, BOB, ROOT
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
