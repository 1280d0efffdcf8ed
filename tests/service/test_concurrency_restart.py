"""Many concurrent requests against a service subprocess; SIGKILL and restart lose nothing."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from .conftest import ALICE, BOB, CAROL, DAVE, ROOT

MIG = {"kind": "mig", "profile": "1g.5gb"}
SHARED = {"kind": "shared", "memory_gib": 6, "model": "L4"}
WHOLE_L4 = {"kind": "whole", "model": "L4"}
USERS = [ALICE, BOB, CAROL, DAVE, ROOT]

pytestmark = pytest.mark.slow


async def post_all(url: str, requests: list[tuple[str, dict]]) -> list[tuple[int, dict]]:
    client = AsyncHTTPClient(force_instance=True, max_clients=len(requests))

    async def one(token: str, body: dict) -> tuple[int, dict]:
        response = await client.fetch(HTTPRequest(url + "leases", method="POST", body=json.dumps(body),
                                                  headers={"Authorization": f"Bearer {token}"},
                                                  request_timeout=60), raise_error=False)
        return response.code, json.loads(response.body)

    try:
        return await asyncio.gather(*(one(token, body) for token, body in requests))
    finally:
        client.close()


def queued_in_order(service) -> list[dict]:
    leases = service.call("GET", "leases?all=1", token=ROOT).json()["leases"]
    return sorted((l for l in leases if l["state"] == "queued"), key=lambda l: l["position"])


def check_no_double_booking(service) -> list[dict]:
    leases = service.call("GET", "leases?all=1", token=ROOT).json()["leases"]
    granted = [l for l in leases if l["state"] == "granted"]
    migs = [l["slice"]["mig_uuid"] for l in granted if l["slice"]["kind"] == "mig"]
    assert len(migs) == len(set(migs))
    owners = {}
    share_mib = defaultdict(int)
    for gpu in service.call("GET", "inventory", token=ROOT).json()["nodes"][0]["gpus"]:
        for inst in gpu.get("instances", []):
            if inst["lease_id"]:
                owners[inst["uuid"]] = inst["lease_id"]
        for share in gpu.get("shares", []):
            share_mib[gpu["uuid"]] += share["memory_mib"]
        assert share_mib[gpu["uuid"]] <= gpu["memory_mib"]
    assert owners == {l["slice"]["mig_uuid"]: l["id"] for l in granted if l["slice"]["kind"] == "mig"}
    by_gpu = defaultdict(int)
    for lease in granted:
        if lease["slice"]["kind"] == "shared":
            by_gpu[lease["slice"]["gpu_uuids"][0]] += lease["slice"]["memory_mib"]
    assert dict(by_gpu) == {k: v for k, v in share_mib.items() if v}
    positions = [l["position"] for l in queued_in_order(service)]
    assert positions == list(range(1, len(positions) + 1))
    return leases


def test_200_concurrent_requests_get_definite_answers_and_fair_promotion(fresh_service):
    service = fresh_service().start()
    requests = []
    for n in range(200):
        body = {"spec": SHARED if n % 4 == 3 else MIG, "holder": f"job:{n}"}
        if n % 5 == 4:
            body["wait"] = 0
        requests.append((USERS[n % len(USERS)], body))
    answers = asyncio.run(post_all(service.url, requests))
    counts = defaultdict(int)
    for (token, body), (status, answer) in zip(requests, answers, strict=True):
        counts[status] += 1
        if status == 201:
            assert answer["state"] == "granted" and answer["slice"]
        elif status == 202:
            assert answer["state"] == "queued" and answer["position"] >= 1 and "wait" not in body
        elif status == 403:
            assert token == CAROL and answer["quota"]["key"] == "slices"
        else:
            assert status == 409 and body["wait"] == 0 and answer["reason"].startswith("no capacity"), answer
    assert counts[201] == 14 + 6 and counts[202] > 100 and set(counts) <= {201, 202, 403, 409}
    leases = check_no_double_booking(service)
    assert sum(1 for l in leases if l["state"] == "queued") == counts[202]

    for _ in range(12):
        granted = [l for l in service.call("GET", "leases?all=1", token=ROOT).json()["leases"]
                   if l["state"] == "granted"]
        lease = granted[0]
        expected = next_in_line(service, released=lease)
        assert service.call("DELETE", f"leases/{lease['id']}", token=ROOT).status == 200
        assert service.call("GET", f"leases/{expected['id']}", token=ROOT).json()["state"] == "granted"
        check_no_double_booking(service)


def next_in_line(service, released: dict) -> dict:
    """The queued request that the release of `released` must promote, by the documented order:
    priority class, then the user's GPU memory in use (fair share), then age; over-quota users skipped."""
    leases = service.call("GET", "leases?all=1", token=ROOT).json()["leases"]
    usage: dict[str, int] = defaultdict(int)
    slices: dict[str, int] = defaultdict(int)
    for lease in leases:
        if lease["state"] == "granted" and lease["id"] != released["id"]:
            usage[lease["user"]] += lease["slice"]["memory_mib"]
            slices[lease["user"]] += 1
    kind = released["slice"]["kind"]
    waiting = [l for l in leases if l["state"] == "queued" and l["spec"]["kind"] == kind
               and not (l["user"] == "carol" and slices["carol"] >= 1)]
    rank = {"interactive": 0, "batch": 1}
    return min(waiting, key=lambda l: (rank[l["priority"]], usage[l["user"]], l["created_at"], l["position"]))


def test_sigkill_and_restart_lose_no_lease_and_no_queue_position(fresh_service):
    service = fresh_service().start()
    for token, spec, holder in [(ALICE, WHOLE_L4, "job:1"), (BOB, WHOLE_L4, "job:2"), (ALICE, MIG, "kernel:a"),
                                (BOB, MIG, "kernel:b"), (DAVE, WHOLE_L4, "job:3"), (CAROL, WHOLE_L4, "job:4"),
                                (ALICE, WHOLE_L4, "job:5")]:
        assert service.call("POST", "leases", {"spec": spec, "holder": holder}, token).status in (201, 202)
    before = service.call("GET", "leases?all=1", token=ROOT).json()["leases"]
    assert sorted(l["position"] for l in before if l["state"] == "queued") == [1, 2, 3]
    service.kill()
    service.start()
    after = service.call("GET", "leases?all=1", token=ROOT).json()["leases"]

    def essentials(leases):
        return [(l["id"], l["user"], l["holder"], l["state"], l["slice"], l["position"], l["created_at"])
                for l in leases]

    assert essentials(after) == essentials(before)
    first = min((l for l in after if l["state"] == "queued"), key=lambda l: l["position"])
    whole = next(l for l in after if l["state"] == "granted" and l["slice"]["kind"] == "whole")
    service.call("DELETE", f"leases/{whole['id']}", token=ROOT)
    assert service.call("GET", f"leases/{first['id']}", token=ROOT).json()["state"] == "granted"


def test_sigkill_keeps_dynamic_mig_instances_and_their_leases(fresh_service, tmp_path):
    fleet = tmp_path / "dynamic.yaml"
    fleet.write_text("nodes:\n  - name: node0\n    cpu_milli: 8000\n    memory_mib: 65536\n"
                     "    gpus: [{model: A100-SXM4-40GB, mig: dynamic}]\n")
    service = fresh_service(fleet=fleet).start()
    for token, profile, holder in [(ALICE, "3g.20gb", "kernel:a"), (BOB, "4g.20gb", "kernel:b")]:
        body = {"spec": {"kind": "mig", "profile": profile}, "holder": holder}
        assert service.call("POST", "leases", body, token).status == 201
    before = service.call("GET", "leases?all=1", token=ROOT).json()["leases"]
    service.kill()
    service.start()
    after = service.call("GET", "leases?all=1", token=ROOT).json()["leases"]
    assert [(l["id"], l["state"], l["slice"]) for l in after] == [(l["id"], l["state"], l["slice"]) for l in before]
    instances = service.call("GET", "inventory", token=ROOT).json()["nodes"][0]["gpus"][0]["instances"]
    assert sorted((i["profile"], i["start"], i["lease_id"]) for i in instances) == sorted(
        (l["slice"]["profile"], l["slice"]["start"], l["id"]) for l in before)
    gone = next(l for l in after if l["slice"]["profile"] == "4g.20gb")
    service.call("DELETE", f"leases/{gone['id']}", token=ROOT)
    again = service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "4g.20gb"}, "holder": "kernel:c"},
                         CAROL)
    assert again.status == 201 and again.json()["slice"]["start"] == 0
