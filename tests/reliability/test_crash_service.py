"""The service over each store (SQLite, PostgreSQL): SIGKILL and restart keep every lease,
MIG instance and queue position; a failed request leaves the next ones served."""

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


def test_sigkill_and_restart_keep_leases_instances_and_queue(store_urls, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET_YAML)
    svc = ServiceProcess(tmp_path / "svc", fleet=fleet,
                         args=(f"--GpuAllocService.simulated_state={tmp_path / 'devices.json'}",))
    svc.db = store_urls.fresh()
    try:
        svc.start()
        for token, spec, holder in [(ALICE, {"kind": "mig", "profile": "4g.20gb"}, "kernel:a"),
                                    (BOB, {"kind": "mig", "profile": "3g.20gb"}, "kernel:b"),
                                    (DAVE, {"kind": "whole", "model": "L4", "count": 2}, "job:d"),
                                    (ALICE, {"kind": "whole", "model": "L4"}, "job:a"),
                                    (CAROL, {"kind": "mig", "profile": "7g.40gb"}, "kernel:c")]:
            answer = svc.call("POST", "leases", {"spec": spec, "holder": holder}, token)
            assert answer.status in (201, 202), answer
        before = essentials(svc)
        assert [l[3] for l in before].count("queued") == 2
        svc.kill(signal.SIGKILL)
        svc.start()
        assert essentials(svc) == before
        mig = next(l for l in before if l[2] == "kernel:a")
        assert svc.call("DELETE", f"leases/{mig[0]}", token=ALICE).status == 200
        whole = next(l for l in before if l[2] == "job:d")
        assert svc.call("DELETE", f"leases/{whole[0]}", token=DAVE).status == 200
        after = {l[2]: l for l in essentials(svc)}
        assert after["job:a"][3] == "granted"  # first in line for an L4
        assert after["kernel:c"][3] == "queued"  # 7g.40gb still waits for bob's 3g.20gb
        instances = [i for n in svc.call("GET", "inventory", token=ROOT).json()["nodes"] for g in n["gpus"]
                     for i in g.get("instances", [])]
        assert [i["lease_id"] for i in instances] == [after["kernel:b"][0]]  # alice's instance destroyed
    finally:
        svc.kill(signal.SIGTERM)


def test_a_store_outage_answers_503_changes_nothing_and_passes(store_urls, tmp_path):
    """The leases table goes away under the running service (as when a database is restored or
    its permissions change): writes answer 503 and are undone, MIG instance included; once it is
    back, the same requests succeed and a restart sees exactly what was answered."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET_YAML)
    svc = ServiceProcess(tmp_path / "svc", fleet=fleet,
                         args=(f"--GpuAllocService.simulated_state={tmp_path / 'devices.json'}",))
    svc.db = store_urls.fresh()
    database = create_engine(svc.db)
    mig = {"spec": {"kind": "mig", "profile": "3g.20gb"}, "holder": "kernel:b"}
    try:
        svc.start()
        assert svc.call("POST", "leases", {"spec": {"kind": "whole", "model": "L4"}, "holder": "job:a"},
                        ALICE).status == 201
        before = essentials(svc)
        with database.begin() as conn:
            conn.execute(text("ALTER TABLE leases RENAME TO leases_away"))
        refused = svc.call("POST", "leases", mig, BOB)
        assert refused.status == 503 and refused.headers["Retry-After"] == "5", refused
        assert svc.call("DELETE", f"leases/{before[0][0]}", token=ALICE).status == 503
        assert essentials(svc) == before
        gpus = svc.call("GET", "inventory", token=ROOT).json()["nodes"][0]["gpus"]
        assert [g.get("instances") for g in gpus if g["model"].startswith("A100")] == [[]]
        with database.begin() as conn:
            conn.execute(text("ALTER TABLE leases_away RENAME TO leases"))
        assert svc.call("POST", "leases", mig, BOB).status == 201
        answered = essentials(svc)
        svc.kill(signal.SIGKILL)
        svc.start()
        assert essentials(svc) == answered
    finally:
        svc.kill(signal.SIGTERM)
        database.dispose()
