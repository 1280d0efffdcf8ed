"""SIGKILL before every store write and MIG device call of a grant, a release and a preemption; restart.

A paced child process (paced_child.py) announces each step and waits; the test kills it at
each step in turn, recovers a scheduler over the same database and simulated devices (whose MIG
layout outlives the process, as a real GPU's does) and checks invariants.py: nothing lost or
made up, no orphan or double-booked MIG instance, the administrator's instance untouched, the
queue in its order. Runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store

from .invariants import check_consistent, check_transition, device_instances, lease_states
from .paced_child import POLICY

ROOT = Path(__file__).resolve().parents[2]
A100 = "A100-SXM4-40GB"
FLEET = {"nodes": [{"name": "n0", "cpu_milli": 64000, "memory_mib": 262144, "gpus": [
    {"model": A100, "mig": "dynamic"},
    {"model": A100, "mig": "dynamic", "layout": ["1g.5gb"]},  # the administrator's instance
    {"model": "L4"}]}]}
ADMIN_INSTANCES = set(device_instances(SimulatedBackend(FLEET)))


class PacedRun:
    """One child process over a database and a device state file, stopped at step `kill_at`."""

    def __init__(self, url: str, state_file: Path, scenario: str, log: Path):
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.paced_child", json.dumps(FLEET), url, str(state_file),
             scenario], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"),
            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"the child ended early:\n{self.log.read_text()}"
        return json.loads(line)

    def run(self, kill_at: int | None) -> tuple[dict, list[str], dict | None]:
        """(state before the operation, the steps it took until the kill, state after it or None)."""
        try:
            ready = self.read()["ready"]
            steps: list[str] = []
            while True:
                message = self.read()
                if kill_at == len(steps):
                    return ready, steps, message.get("done")
                if "done" in message:
                    return ready, steps, message["done"]
                steps.append(message["step"])
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
        finally:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc.stdin.close()
            self.proc.stdout.close()


@pytest.mark.parametrize("scenario, expected_steps", [
    ("grant", ["store.record_intent", "device.create_mig_instance", "store.save"]),
    ("release", ["store.save", "device.destroy_mig_instance", "store.save", "store.record_intent",
                 "device.create_mig_instance", "store.save"]),
    ("preempt", ["store.save", "store.save", "device.destroy_mig_instance", "store.save", "store.record_intent",
                 "device.create_mig_instance", "store.save"]),
])
def test_sigkill_at_every_step_recovers_consistently(store_urls, tmp_path, scenario, expected_steps):
    # the uninterrupted run, killed once done, is also the kill after the last step
    runs = {len(expected_steps): (store_urls.fresh(), tmp_path / "devices-done.json")}
    ready, steps, done = PacedRun(*runs[len(expected_steps)], scenario, tmp_path / "done.log").run(None)
    assert steps == expected_steps and done is not None
    problems = []
    for kill_at in range(len(steps) + 1):
        if kill_at not in runs:
            runs[kill_at] = (store_urls.fresh(), tmp_path / f"devices{kill_at}.json")
            before, _, _ = PacedRun(*runs[kill_at], scenario, tmp_path / f"kill{kill_at}.log").run(kill_at)
            assert before == ready
        url, state_file = runs[kill_at]
        store = Store(url)
        backend = SimulatedBackend(FLEET, state_file=state_file)
        try:
            recovered = Scheduler(backend, store, SchedulerPolicy(**POLICY), now=100)
            found = check_consistent(recovered, store, backend, ADMIN_INSTANCES)
            found += check_transition(recovered, {k: tuple(v) for k, v in ready["leases"].items()},
                                      {k: tuple(v) for k, v in done["leases"].items()}, ready["queue"])
            store.close()
            store = Store(url)  # recovery itself is stored: a second start finds nothing to change
            again = Scheduler(SimulatedBackend(FLEET, state_file=state_file), store, SchedulerPolicy(**POLICY),
                              now=200)
            if lease_states(again) != lease_states(recovered) or device_instances(backend) != device_instances(
                    again.backend):
                found.append("a second start changed what the first recovered")
        finally:
            store.close()
        label = steps[kill_at] if kill_at < len(steps) else "after the last step"
        problems += [f"killed before {label} (step {kill_at}): {p}" for p in found]
    assert not problems, "\n".join(problems)
