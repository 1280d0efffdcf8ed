"""A scheduler process killed with SIGKILL mid-stream: a new one recovers the same leases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store

from .conftest import A100_40

FLEET = {"nodes": [{"name": "n0", "cpu_milli": 64000, "memory_mib": 262144, "gpus": [
    {"model": A100_40, "count": 1, "mig": "static", "layout": ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]},
    {"model": "L4", "count": 2}, {"model": "T4", "count": 2}]}]}

CHILD = textwrap.dedent("""
    import json, random, sys
    from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
    from jupyter_gpualloc.core.model import SliceSpec
    from jupyter_gpualloc.core.policy import SchedulerPolicy
    from jupyter_gpualloc.core.scheduler import Scheduler
    from jupyter_gpualloc.core.store import Store

    fleet, url = json.loads(sys.argv[1]), sys.argv[2]
    s = Scheduler(SimulatedBackend(fleet), Store(url), SchedulerPolicy(heartbeat_ttl=0, preemption=False))
    specs = [{"kind": "shared", "memory_gib": 3}, {"kind": "mig", "profile": "1g.5gb"},
             {"kind": "whole", "model": "T4"}, {"kind": "mig", "profile": "2g.10gb"}]
    rng = random.Random(7)
    for i in range(100000):
        sys.stdin.readline()  # the test paces the operations, so it knows which one its kill interrupts
        active = s.leases()
        if active and rng.random() < 0.4:
            victim = rng.choice(active).id
            print(json.dumps({"doing": "release", "id": victim}), flush=True)
            s.release(victim, now=i)
        else:
            lease_id = f"L{i}"
            print(json.dumps({"doing": "submit", "id": lease_id}), flush=True)
            s.submit(f"u{i % 5}", f"kernel:{i}", SliceSpec.from_json(rng.choice(specs)), now=i, lease_id=lease_id)
        print(json.dumps({l.id: [l.state.value, l.slice.visible_devices if l.slice else None]
                          for l in s.leases()}), flush=True)
""")


def test_sigkill_mid_stream_loses_nothing(store_urls):
    url = store_urls.fresh()
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(FLEET), url], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    snapshot = {}
    try:
        for _ in range(150):  # operations run to completion, one at a time
            child.stdin.write("\n")
            child.stdin.flush()
            child.stdout.readline()
            snapshot = json.loads(child.stdout.readline())
        child.stdin.write("\n")  # one more, killed while it runs
        child.stdin.flush()
        doing = json.loads(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert "doing" in doing and len(snapshot) > 3

    recovered = Scheduler(SimulatedBackend(FLEET), Store(url), SchedulerPolicy(heartbeat_ttl=0, preemption=False),
                          now=1e6)
    after = {l.id: [l.state.value, l.slice.visible_devices if l.slice else None] for l in recovered.leases()}
    in_flight = doing["id"]
    for lease_id, (state, devices) in snapshot.items():
        if lease_id == in_flight:
            continue  # the op in flight may or may not have committed before the kill
        if state == "granted":
            assert after[lease_id] == [state, devices], lease_id
        else:  # queued: still queued, or granted by the release that was in flight
            assert after[lease_id][0] in ("queued", "granted")
    assert set(after) - set(snapshot) <= {in_flight}
    recovered.store.close()
