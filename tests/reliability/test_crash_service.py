"""The service over each store (SQLite, PostgreSQL): SIGKILL and restart keep every lease,
MIG instance and queue position; a failed request leaves the next ones served."""

from __future__ import annotations

import signal

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
