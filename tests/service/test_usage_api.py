"""GET /usage over real HTTP: who sees what, CSV, bad input, quotas, and the Prometheus counter
that the Grafana dashboard in docs/grafana reads."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import ALICE, BOB, CAROL, DAVE, POLICY, ROOT, ServiceProcess

DASHBOARDS = Path(__file__).parents[2] / "docs" / "grafana"
USAGE_POLICY = POLICY + """
c.SchedulerPolicy.usage_quotas = {"*": {"gpu_hours": 40, "window": "7d"},
                                  "students": {"gpu_hours": 200, "window": "calendar_week", "per": "group"}}
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """A service whose leases of alice and bob have ended, so both have usage."""
    svc = ServiceProcess(tmp_path_factory.mktemp("usage"), config=USAGE_POLICY).start()
    for token, holder in ((ALICE, "kernel:u1"), (BOB, "kernel:u2")):
        lease = svc.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": holder}, token)
        assert lease.status == 201, lease
        time.sleep(0.2)
        assert svc.call("DELETE", f"leases/{lease.json()['id']}", token=token).status == 200
    yield svc
    svc.kill(signal.SIGTERM)


def test_a_user_sees_only_their_own_usage_and_quotas(service):
    mine = service.call("GET", "usage?since=2020-01-01", token=ALICE)
    assert mine.status == 200, mine
    report = mine.json()
    assert report["user"] == "alice" and [r["user"] for r in report["rows"]] == ["alice"]
    row = report["rows"][0]
    assert row["leases"] == 1 and 0 < row["gpu_hours"] < 0.01 and row["gib_hours"] > row["gpu_hours"]
    assert report["total"]["gpu_hours"] == row["gpu_hours"]
    [quota] = report["quotas"]
    assert quota["scope"] == "user" and quota["limit"] == 40 and quota["window"] == "7d"
    assert quota["message"].startswith("you have used 0.00 of 40 GPU-hours in the last 7d")
    bob = service.call("GET", "usage?since=2020-01-01&by=group", token=BOB).json()
    assert [r["group"] for r in bob["rows"]] == ["students"]
    assert {q["who"] for q in bob["quotas"]} == {"bob", "students"}
    assert service.call("GET", "usage?since=2020-01-01", token=CAROL).json()["rows"] == []
    document = service.call("GET", "openapi.json").json()
    schema = {"$ref": "#/components/schemas/UsageReport", "components": document["components"]}
    for answer in (report, bob):
        jsonschema.Draft202012Validator(schema).validate(answer)


def test_only_admins_see_other_users(service):
    refused = service.call("GET", "usage?user=bob", token=ALICE)
    assert refused.status == 403 and refused.json()["field"] == "user"
    everyone = service.call("GET", "usage?since=2020-01-01", token=ROOT).json()
    assert everyone["user"] is None and {r["user"] for r in everyone["rows"]} == {"alice", "bob"}
    one = service.call("GET", "usage?since=2020-01-01&user=bob&by=model", token=ROOT).json()
    assert [r["model"] for r in one["rows"]] == ["A100-SXM4-40GB"]


def test_csv_on_request(service):
    import urllib.request

    request = urllib.request.Request(service.url + "usage?since=2020-01-01&by=holder_kind",
                                     headers={"Authorization": f"Bearer {ROOT}", "Accept": "text/csv"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/csv")
        lines = response.read().decode().splitlines()
    assert lines[0] == "holder_kind,gpu_hours,gib_hours,leases"
    assert lines[1].startswith("kernel,") and lines[1].endswith(",2")


@pytest.mark.parametrize("query, field", [
    ("by=team", "by"), ("since=yesterday", "since"), ("since=2026-11-02&until=2026-11-01", "until"),
    ("until=nan", "until"), ("limit=3", "limit"),
])
def test_bad_queries_name_the_field(service, query, field):
    response = service.call("GET", f"usage?{query}", token=ALICE)
    assert response.status == 400 and response.json()["field"] == field, response


def test_requests_are_refused_once_a_usage_quota_is_used_up(fresh_service):
    svc = fresh_service(config=POLICY + 'c.SchedulerPolicy.usage_quotas = {"alice": {"gpu_hours": 0}}\n').start()
    refused = svc.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "kernel:x"}, ALICE)
    assert refused.status == 403, refused
    assert refused.json()["quota"] == {"scope": "user", "key": "gpu_hours", "limit": 0}
    assert refused.json()["error"].startswith("you have used 0.00 of 0 GPU-hours in the last 7d")


def test_prometheus_counter_and_the_dashboard_use_only_exported_metrics(service):
    text = service.call("GET", "metrics", token=ROOT).text
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    hours = [s for family in text_string_to_metric_families(text) for s in family.samples
             if s.name == "gpualloc_gpu_hours_total"]
    assert {(s.labels["user"], s.labels["group"], s.labels["kind"]) for s in hours} == \
        {("alice", "", "mig"), ("bob", "students", "mig")}
    assert all(s.value > 0 for s in hours)
    dashboards = sorted(DASHBOARDS.glob("*.json"))
    assert dashboards
    for path in dashboards:
        board = json.loads(path.read_text())
        queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
        queries += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
        assert queries, path
        for query in queries:
            names = set(re.findall(r"\bgpualloc_[a-z_]+", query))
            assert names, query
            assert names <= set(samples), (path.name, names - set(samples))


def run_cli(service, *args: str, token: str = ALICE) -> subprocess.CompletedProcess:
    base = service.url[: -len("api/v1/")]
    return subprocess.run([sys.executable, "-m", "jupyter_gpualloc.cli", "usage", *args, "--url", base,
                           "--token", token], capture_output=True, text=True, timeout=60)


def test_cli_prints_a_table_and_csv(service):
    table = run_cli(service, "--since", "2020-01-01", "--by", "group", token=ROOT)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("GPU usage from 2020-01-01 00:00 UTC to ") and lines[0].endswith("for everyone")
    assert re.fullmatch(r"group +GPU-hours +GiB-hours +leases", lines[1])
    assert sorted(line.split()[0] for line in lines[2:4]) == ["-", "students"]
    assert lines[4].startswith("total")
    mine = run_cli(service, "--since", "2020-01-01", "--csv")
    assert mine.stdout.splitlines()[0] == "user,gpu_hours,gib_hours,leases"
    assert [line.split(",")[0] for line in mine.stdout.splitlines()[1:]] == ["alice"]
    refused = run_cli(service, "--user", "bob")
    assert refused.returncode == 1 and refused.stderr.strip() == \
        "error: only the allocator's admins see other users' usage"
    bad = run_cli(service, "--since", "last week")
    assert bad.returncode == 1 and "since must be a date" in bad.stderr


def test_utilization_samples_feed_the_efficiency_report(service):
    lease = service.call("POST", "leases", {"spec": {"kind": "whole", "model": "L4"}, "holder": "kernel:e"}, CAROL)
    assert lease.status == 201, lease
    lease_id = lease.json()["id"]
    for bad, field in (({"sm_percent": 120}, "sm_percent"), ({"sm_percent": 5, "pid": 1}, "pid"), ({}, "sm_percent")):
        response = service.call("POST", f"leases/{lease_id}/utilization", bad, CAROL)
        assert response.status == 400 and response.json()["field"] == field, response
    assert service.call("POST", f"leases/{lease_id}/utilization", {"sm_percent": 3}, ALICE).status == 404
    for percent in (3, 3):
        assert service.call("POST", f"leases/{lease_id}/utilization", {"sm_percent": percent}, CAROL).status == 200
        time.sleep(0.3)
    assert service.call("DELETE", f"leases/{lease_id}", token=CAROL).status == 200
    mine = service.call("GET", "usage/efficiency?since=2020-01-01", token=CAROL).json()
    [row] = mine["rows"]
    assert row["lease_id"] == lease_id and 0 < row["busy_gpu_hours"] < row["gpu_hours"]
    assert row["message"].startswith("carol's kernel holds 22.494 GiB, used ")
    assert service.call("GET", "usage/efficiency", token=ALICE).json()["rows"] == []
    assert [r["user"] for r in service.call("GET", "usage/efficiency?since=2020-01-01", token=ROOT).json()["rows"]] \
        == ["carol"]
    assert service.call("GET", "usage/efficiency?user=carol", token=ALICE).status == 403
    table = run_cli(service, "--efficiency", "--since", "2020-01-01", token=CAROL)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].endswith("for carol") and lines[2].startswith(lease_id)
    assert lines[2].endswith(row["message"])


def test_usage_routes_need_a_token(service):
    for method, path in [("GET", "usage"), ("GET", "usage/efficiency"), ("POST", "leases/x/extend"),
                         ("POST", "leases/x/utilization")]:
        for token in (None, "not-a-known-token"):
            response = service.call(method, path, {"sm_percent": 1} if method == "POST" else None, token)
            assert response.status == 401, (method, path, response)


def validate(service, answer: dict, schema: str) -> None:
    document = service.call("GET", "openapi.json").json()
    jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{schema}",
                                     "components": document["components"]}).validate(answer)


def test_recent_utilization_samples_are_for_the_owner_and_admins_only(service):
    lease = service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "kernel:s"}, DAVE)
    assert lease.status == 201, lease
    lease_id = lease.json()["id"]
    try:
        none = service.call("GET", f"leases/{lease_id}/utilization", token=DAVE)
        assert none.status == 200 and none.json()["samples"] == [], none  # nothing samples it yet
        for percent in (10, 80.5):
            assert service.call("POST", f"leases/{lease_id}/utilization", {"sm_percent": percent}, DAVE).status == 200
        mine = service.call("GET", f"leases/{lease_id}/utilization", token=DAVE).json()
        assert [s["sm_percent"] for s in mine["samples"]] == [10, 80.5]
        assert mine["lease_id"] == lease_id and mine["window"] == 600
        assert mine["samples"][0]["at"] <= mine["samples"][1]["at"] <= mine["now"]
        validate(service, mine, "UtilizationSamples")
        other = service.call("GET", f"leases/{lease_id}/utilization", token=ALICE)
        assert other.status == 404 and "no lease" in other.json()["error"], other  # not even that it exists
        assert "samples" not in other.text
        assert service.call("GET", f"leases/{lease_id}/utilization", token=ROOT).json()["samples"] == mine["samples"]
        assert service.call("GET", f"leases/{lease_id}/utilization", token=None).status == 401
    finally:
        assert service.call("DELETE", f"leases/{lease_id}", token=DAVE).status == 200
    assert service.call("GET", f"leases/{lease_id}/utilization", token=DAVE).json()["samples"] == []  # ended


def test_usage_history_by_day_and_offer_is_the_callers_own(service):
    mine = service.call("GET", "usage/history", token=ALICE)
    assert mine.status == 200, mine
    history = mine.json()
    assert history["user"] == "alice" and history["until"] - history["since"] <= 14 * 86400
    [today] = history["days"]
    assert today["day"] == time.strftime("%Y-%m-%d", time.gmtime(history["until"]))
    assert list(today["offers"]) == [""]  # a spec of its own, not an offer
    assert today["gpu_hours"] == today["offers"][""] > 0
    assert today["gpu_hours"] == pytest.approx(
        service.call("GET", "usage?since=2020-01-01", token=ALICE).json()["total"]["gpu_hours"], abs=1e-5)
    validate(service, history, "UsageHistory")
    refused = service.call("GET", "usage/history?user=bob", token=ALICE)
    assert refused.status == 403 and refused.json()["field"] == "user"
    assert service.call("GET", "usage/history?days=3", token=ALICE).json()["field"] == "days"
    bob = service.call("GET", "usage/history?user=bob", token=ROOT).json()
    assert bob["user"] == "bob" and len(bob["days"]) == 1
