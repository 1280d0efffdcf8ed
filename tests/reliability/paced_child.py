"""A scheduler process whose every store write and device call waits for a line on stdin.

Run from the repository root as `python -m tests.reliability.paced_child FLEET_JSON STORE_URL
STATE_FILE SCENARIO`: it builds the scenario's starting state, prints {"ready": ...}, then runs it;
before each store write or MIG device call it prints {"step": what} and waits for a line, so the
test can SIGKILL it exactly before that step. At the end it prints {"done": ...}. Both give the
leases as `invariants.lease_states` does, and the queue's lease ids in order.
"""

from __future__ import annotations

import json
import sys

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import PriorityClass, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store
from tests.reliability.invariants import lease_states

POLICY = {"heartbeat_ttl": 0, "wait_for_holders": False}  # its holders are names: nothing reports them gone
BATCH = PriorityClass.BATCH


def mig(profile: str) -> SliceSpec:
    return SliceSpec.from_json({"kind": "mig", "profile": profile})


SHARED = SliceSpec.from_json({"kind": "shared", "memory_gib": 8, "model": "L4"})

# name -> (setup: [(user, holder, spec, lease id[, priority])], the paced operation)
SCENARIOS = {
    # a grant that makes a MIG instance: intent, create, commit
    "grant": ([("alice", "kernel:a", mig("4g.20gb"), "A"), ("bob", "kernel:b", SHARED, "B")],
              lambda s: s.submit("carol", "kernel:c", mig("3g.20gb"), now=10, lease_id="C")),
    # a release that destroys an instance, then grants two waiting requests new ones in its place
    "release": ([("alice", "kernel:a", mig("7g.40gb"), "A"), ("bob", "kernel:b", mig("7g.40gb"), "B"),
                 ("carol", "kernel:c", mig("3g.20gb"), "C"), ("dave", "kernel:d", mig("3g.20gb"), "D"),
                 ("erin", "kernel:e", SHARED, "E"), ("frank", "kernel:f", mig("4g.20gb"), "F")],
                lambda s: s.release("A", now=10)),
    # an interactive request queues, preempts a batch lease, destroys its instance, makes its own
    "preempt": ([("alice", "job:a", mig("7g.40gb"), "A", BATCH), ("bob", "kernel:b", SHARED, "B")],
                lambda s: s.submit("carol", "kernel:c", mig("7g.40gb"), now=10, lease_id="C")),
}


def pace(obj, name: str, label: str) -> None:
    real = getattr(obj, name)

    def paced(*args, **kwargs):
        print(json.dumps({"step": label}), flush=True)
        sys.stdin.readline()
        return real(*args, **kwargs)

    setattr(obj, name, paced)


def summary(s: Scheduler) -> dict:
    return {"leases": lease_states(s), "queue": [l.id for l in s.queue()]}


def main(fleet: str, url: str, state_file: str, scenario: str) -> None:
    backend = SimulatedBackend(json.loads(fleet), state_file=state_file)
    store = Store(url)
    s = Scheduler(backend, store, SchedulerPolicy(**POLICY))
    setup, operation = SCENARIOS[scenario]
    for user, holder, spec, lease_id, *priority in setup:
        s.submit(user, holder, spec, *priority, now=1, lease_id=lease_id)
    print(json.dumps({"ready": summary(s)}), flush=True)
    for name in ("save", "record_intent", "clear_intents"):
        pace(store, name, f"store.{name}")
    for name in ("create_mig_instance", "destroy_mig_instance"):
        pace(backend, name, f"device.{name}")
    operation(s)
    print(json.dumps({"done": summary(s)}), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main(*sys.argv[1:])
