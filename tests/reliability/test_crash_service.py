"""The service over each store (SQLite, PostgreSQL): a store outage answers 503 and changes
nothing; SIGKILL and restart keep every lease, MIG instance and queue position."""

from __future__ import annotations

import signal

from sqlalchemy import create_engine, text

from tests.service.conftest import ALICE, BOB, CAROL, DAVE, ROOT, ServiceProcess

FLEET_YAML = """nodes:
  - name: node0
    cpu_milli: 16000
    memory_mib: 131072
    gpus:
      - {model: A100-SXM4-40GB, mig: dynamic}
      - {model: L4, count: 2}
"""


def essentials(svc: ServiceProcess) -> list[tuple]:
    leases = svc.call("GET", "leases?all=1", token=ROOT).json()["leases"]
    return [(l["id"], l["user"], l["holder"], l["state"], l["slice"], l["position"]) for l in leases]


def instance_owners(svc: ServiceProcess) -> list[str | None]:
    return [i["lease_id"] for n in svc.call("GET", "inventory", token=ROOT).json()["nodes"] for g in n["gpus"]
            for i in g.get("instances", [])]


def test_outage_then_sigkill_lose_nothing_and_invent_nothing(store_urls, tmp_path):
    """The leases table goes away under the running service (as when a database is restored or its
    permissions change): writes answer 503 and are undone, MIG instance included. Once it is back
    the same requests succeed, and a SIGKILL and restart keep exactly what was answered."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET_YAML)
    svc = ServiceProcess(tmp_path / "svc", fleet=fleet,
                         args=(f"--GpuAllocService.simulated_state={tmp_path / 'devices.json'}",))
    svc.db = store_urls.fresh()
    database = create_engine(svc.db)
    three_g = {"spec": {"kind": "mig", "profile": "3g.20gb"}, "holder": "kernel:b"}
    try:
        svc.start()
        for token, spec, holder in [(ALICE, {"kind": "mig", "profile": "4g.20gb"}, "kernel:a"),
                                    (DAVE, {"kind": "whole", "model": "L4", "count": 2}, "job:d"),
                                    (ALICE, {"kind": "whole", "model": "L4"}, "job:a")]:
            assert svc.call("POST", "leases", {"spec": spec, "holder": holder}, token).status in (201, 202)
        before = essentials(svc)
        with database.begin() as conn:
            conn.execute(text("ALTER TABLE leases RENAME TO leases_away"))
        refused = svc.call("POST", "leases", three_g, BOB)
        assert refused.status == 503 and refused.headers["Retry-After"] == "5", refused
        assert svc.call("DELETE", f"leases/{before[0][0]}", token=ALICE).status == 503
        assert svc.call("GET", "leases/0123456789abcdef", token=ALICE).status == 503  # ended ones: in the store
        assert essentials(svc) == before and instance_owners(svc) == [before[0][0]]
        with database.begin() as conn:
            conn.execute(text("ALTER TABLE leases_away RENAME TO leases"))
        assert svc.call("POST", "leases", three_g, BOB).status == 201
        assert svc.call("POST", "leases", {"spec": {"kind": "mig", "profile": "7g.40gb"}, "holder": "kernel:c"},
                        CAROL).status == 202
        answered = essentials(svc)
        assert [l[3] for l in answered].count("queued") == 2

        svc.kill(signal.SIGKILL)
        svc.start()
        assert essentials(svc) == answered
        by_holder = {l[2]: l for l in answered}
        assert svc.call("DELETE", f"leases/{by_holder['kernel:a'][0]}", token=ALICE).status == 200
        assert svc.call("DELETE", f"leases/{by_holder['job:d'][0]}", token=DAVE).status == 200
        after = {l[2]: l for l in essentials(svc)}
        assert after["job:a"][3] == "granted"  # first in line for an L4
        assert after["kernel:c"][3] == "queued"  # 7g.40gb still waits for bob's 3g.20gb
        assert instance_owners(svc) == [after["kernel:b"][0]]  # alice's instance was destroyed
    finally:
        svc.kill(signal.SIGTERM)
        database.dispose()
