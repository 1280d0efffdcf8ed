"""A write the store refuses leaves the core exactly as the store has it, devices included."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import HolderBusy, NotFound, QuotaExceeded, Scheduler, StoreFailed
from jupyter_gpualloc.core.store import DeadlineRecord, Store

from .conftest import A100_40, fleet

FLEET = fleet({"model": A100_40, "count": 1, "mig": "dynamic"}, {"model": "L4", "count": 2})
MIG_3G = SliceSpec.from_json({"kind": "mig", "profile": "3g.20gb"})
SHARED = SliceSpec.from_json({"kind": "shared", "memory_gib": 8, "model": "L4"})
POLICY = {"heartbeat_ttl": 0, "preemption": False, "wait_for_holders": False}  # releases by holders that are gone


# The last statement of every save, and the one statement of a MIG intent's write.
LAST_OF = {"save": "INSERT INTO meta", "record_intent": "INSERT INTO mig_intents"}


class FlakyStore(Store):
    """A real store whose database connection drops once, at the last statement of the next
    write of a named kind ('save', 'record_intent'): the transaction's earlier statements ran."""

    def __init__(self, url: str):
        super().__init__(url)
        self.fail_next: set[str] = set()
        for engine in {self.engine, self._intent_engine}:  # on a server, MIG intents have an engine of their own
            event.listen(engine, "before_cursor_execute", self._maybe_fail)

    def _maybe_fail(self, conn, cursor, statement: str, parameters, context, executemany) -> None:
        for what in list(self.fail_next):
            if statement.lstrip().startswith(LAST_OF[what]):
                self.fail_next.discard(what)
                raise OperationalError(statement, parameters,
                                       ConnectionError("server closed the connection unexpectedly"))


def picture(s: Scheduler) -> tuple:
    """What the core holds: its leases with their slices, and every GPU's instances with owners."""
    leases = [(l.id, l.user, l.holder, l.state.value, l.slice.to_json() if l.slice else None, l.seq)
              for l in s.leases()]
    returning = [(l.id, l.state.value, l.slice.to_json()) for l in s.returning()]
    return leases, returning, s.inventory()["nodes"]


def device_instances(backend: SimulatedBackend) -> set[str]:
    return {i.uuid for n in backend.discover() for g in n.gpus for i in g.instances}


def flaky_scheduler(store_urls) -> tuple[str, SimulatedBackend, FlakyStore, Scheduler]:
    """A fresh store that can be told to refuse, and a scheduler of the simulated fleet on it."""
    url = store_urls.fresh()
    backend = SimulatedBackend(FLEET)
    store = FlakyStore(url)
    return url, backend, store, Scheduler(backend, store, SchedulerPolicy(**POLICY))


@pytest.fixture
def setup(store_urls):
    url, backend, store, s = flaky_scheduler(store_urls)
    yield url, backend, store, s
    store.close()


def restart(url: str, backend: SimulatedBackend) -> Scheduler:
    return Scheduler(backend, Store(url), SchedulerPolicy(**POLICY), now=1000)


@pytest.mark.parametrize("failing", ["save", "record_intent"])
def test_a_refused_grant_is_undone_on_the_device_and_others_are_served(setup, failing):
    url, backend, store, s = setup
    alice = s.submit("alice", "kernel:a", MIG_3G, now=1, lease_id="A")
    before, instances = picture(s), device_instances(backend)
    seen = []
    s.subscribe(seen.append)

    store.fail_next.add(failing)
    with pytest.raises(StoreFailed):
        s.submit("bob", "kernel:b", MIG_3G, now=2, lease_id="B")
    assert picture(s) == before and device_instances(backend) == instances  # bob's instance is gone again
    assert not seen  # nothing was announced
    assert store.load().intents == []

    carol = s.submit("carol", "kernel:c", MIG_3G, now=3, lease_id="C")
    shared = s.submit("dave", "kernel:d", SHARED, now=4, lease_id="D")
    assert carol.state is LeaseState.GRANTED and shared.state is LeaseState.GRANTED
    assert [e.type for e in seen].count("lease.granted") == 2
    s.release(alice.id, now=5)

    committed = picture(s)
    again = restart(url, backend)
    assert picture(again) == committed
    assert device_instances(backend) == {c.slice.mig_uuid for c in again.leases() if c.slice.mig_uuid}
    with pytest.raises(NotFound):
        again.lease("B")  # the refused request was never stored
    again.store.close()


def test_a_refused_release_keeps_the_lease_and_its_instance(setup):
    url, backend, store, s = setup
    lease = s.submit("alice", "kernel:a", MIG_3G, now=1, lease_id="A")
    waiting = s.submit("bob", "kernel:b", SliceSpec.from_json({"kind": "mig", "profile": "7g.40gb"}),
                       now=2, lease_id="B")
    assert waiting.state is LeaseState.QUEUED
    before, instances = picture(s), device_instances(backend)

    store.fail_next.add("save")
    with pytest.raises(StoreFailed):
        s.release(lease.id, now=3)
    assert picture(s) == before and device_instances(backend) == instances
    assert s.lease("A").state is LeaseState.GRANTED

    s.release(lease.id, now=4)  # the store answers again: the release goes through, bob gets the GPU
    assert s.lease("B").state is LeaseState.GRANTED
    committed = picture(s)
    again = restart(url, backend)
    assert picture(again) == committed
    assert again.lease("A").state is LeaseState.RELEASED
    again.store.close()


SHARED_GPUS = 8192 / 23034  # what SHARED amounts to on an L4


def test_refused_changes_put_back_deadlines_and_accrual_as_stored(store_urls):
    """A refused extension, deadline warning and release leave the lease's deadline and usage as
    they were, in memory and in the store, so the next tick warns again and nothing is lost."""
    url = store_urls.fresh()
    store = FlakyStore(url)
    s = Scheduler(SimulatedBackend(FLEET), store,
                  SchedulerPolicy(**POLICY, max_duration={"kernel": 100}, deadline_warning=10, max_extensions=1))
    seen = []
    s.subscribe(seen.append)
    s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    for refused in (lambda: s.extend("A", now=50), lambda: s.tick(95), lambda: s.release("A", now=96)):
        store.fail_next.add("save")
        with pytest.raises(StoreFailed):
            refused()
        assert s.deadline("A") == {"at": 101, "extensions": 0, "extensions_left": 1, "warned_at": None}
        assert store.load_deadlines() == [DeadlineRecord("A", 101, 0, None)]
    assert s.usage.report(0, 200, "user", 96) == [{"user": "alice", "gpu_hours": round(95 * SHARED_GPUS / 3600, 6),
                                                   "gib_hours": round(95 * 8 / 3600, 6), "leases": 1}]
    s.tick(97)
    assert [e.type for e in seen] == ["lease.granted", "lease.deadline_warning"]
    s.release("A", now=98)
    assert store.load_deadlines() == []
    assert [(seg.start, seg.end) for seg in store.load_usage(0, 200, "alice")] == [(1, 98)]
    store.close()


def test_a_value_the_database_refuses_poisons_nothing(setup):
    """A lone surrogate cannot be encoded for the database: that one change fails, the next succeed."""
    url, backend, store, s = setup
    lease = s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    before = picture(s)
    with pytest.raises(StoreFailed):
        s.release(lease.id, now=2, reason="bye \ud800")
    assert picture(s) == before
    assert s.submit("bob", "kernel:b", SHARED, now=3, lease_id="B").state is LeaseState.GRANTED
    s.release(lease.id, now=4)
    s.tick(5)
    committed = picture(s)
    again = restart(url, backend)
    assert picture(again) == committed and [l.id for l in again.leases()] == ["B"]
    again.store.close()


def test_a_refused_drain_is_undone(setup):
    url, backend, store, s = setup
    gpu = next(g for n in s.inventory()["nodes"] for g in n["gpus"] if g["model"] == "L4")
    store.fail_next.add("save")
    with pytest.raises(StoreFailed):
        s.drain(gpu["uuid"], now=1)
    assert not any(g["drained"] for n in s.inventory()["nodes"] for g in n["gpus"])
    s.drain(gpu["uuid"], now=2)
    again = restart(url, backend)
    assert [g["drained"] for n in again.inventory()["nodes"] for g in n["gpus"] if g["uuid"] == gpu["uuid"]] == [True]
    again.store.close()


def test_random_changes_with_random_store_failures_stay_as_stored(store_urls, tmp_path):
    """Submits, releases, preemptions and ticks, one in four with a write refused at random:
    a refused change leaves the core as it was, and a restart always finds what the core holds."""
    url = store_urls.fresh()
    fleet_dict = fleet({"model": A100_40, "count": 2, "mig": "dynamic"}, {"model": "L4", "count": 2})
    policy = {"heartbeat_ttl": 0, "reserve_after": 5}
    backend = SimulatedBackend(fleet_dict, state_file=tmp_path / "devices.json")
    store = FlakyStore(url)
    s = Scheduler(backend, store, SchedulerPolicy(**policy))
    specs = [MIG_3G, SHARED, SliceSpec.from_json({"kind": "mig", "profile": "1g.5gb"}),
             SliceSpec.from_json({"kind": "mig", "profile": "7g.40gb"}),
             SliceSpec.from_json({"kind": "whole", "model": "L4"})]
    rng = random.Random(11)
    refused = 0
    for step in range(1, 121):
        before = picture(s)
        store.fail_next = {rng.choice(["save", "record_intent"])} if rng.random() < 0.25 else set()
        try:
            active = s.leases()
            returning = s.returning()
            if active and rng.random() < 0.4:
                s.release(rng.choice(active).id, now=step)
            elif returning and rng.random() < 0.3:
                gone = rng.choice(returning)
                s.holders_gone(gone.user, [gone.holder], now=step)
            elif rng.random() < 0.1:
                s.tick(step)
            else:
                priority = rng.choice(list(PriorityClass))
                s.submit(f"u{step % 6}", f"kernel:{step}", rng.choice(specs), priority, now=step)
        except StoreFailed:
            refused += 1
            assert picture(s) == before, step
        except (HolderBusy, QuotaExceeded):
            pass
        if step % 30 == 0:
            store.fail_next = set()
            s.tick(step)  # grant what a refused follow-up left waiting
            again = Scheduler(SimulatedBackend(fleet_dict, state_file=tmp_path / "devices.json"), Store(url),
                              SchedulerPolicy(**policy), now=step)
            assert picture(again) == picture(s), step
            again.store.close()
    assert refused >= 10, refused
