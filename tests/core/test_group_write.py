"""A group written on another thread while the next one gathers (Scheduler.take_group): the
changes decided meanwhile stand on it, are announced after it, and are undone with it if the store
refuses it; a write on the owner's thread waits for it and is refused with it."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event

from jupyter_gpualloc.core.model import LeaseState
from jupyter_gpualloc.core.scheduler import NotFound, Scheduler, StoreFailed

from .test_store_failures import MIG_3G, SHARED, FlakyStore, device_instances, flaky_scheduler, picture, restart


class PausedWrites:
    """Holds the store's group writes (on the writer thread) at their first statement until `go()`."""

    def __init__(self, store: FlakyStore):
        self.started = threading.Event()
        self.went = threading.Event()
        self._owner = threading.get_ident()
        event.listen(store.engine, "before_cursor_execute", self._wait)

    def _wait(self, *args) -> None:
        if threading.get_ident() != self._owner:
            self.started.set()
            assert self.went.wait(10), "the test never let the write go on"

    def go(self) -> None:
        self.went.set()


@pytest.fixture
def setup(store_urls):
    url, backend, store, s = flaky_scheduler(store_urls)
    seen, outcomes = [], []
    s.subscribe(seen.append)
    yield url, backend, store, s, seen, outcomes
    store.close()


def start_writing(s: Scheduler):
    """Take the waiting group and write it on a thread of its own."""
    write = s.take_group()
    writer = threading.Thread(target=write.write)
    writer.start()
    return write, writer


def test_the_next_group_gathers_while_one_is_written_and_is_announced_after_it(setup):
    url, backend, store, s, seen, outcomes = setup
    paused = PausedWrites(store)
    with store.hold():
        s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    s.after_group(lambda failed: outcomes.append(("first", failed)))
    write, writer = start_writing(s)
    assert paused.started.wait(10)

    with store.hold():  # decided while the first group's transaction is open on the other thread
        s.submit("bob", "kernel:b", SHARED, now=2, lease_id="B")
        s.release("A", now=3)
    s.after_group(lambda failed: outcomes.append(("second", failed)))
    assert seen == [] and outcomes == []

    paused.go()
    writer.join()
    s.settle_group(write)
    assert outcomes == [("first", None)] and [e.type for e in seen] == ["lease.granted"]
    assert store.load_lease("A").state is LeaseState.GRANTED and store.load_lease("B") is None

    s.commit_group()
    assert outcomes == [("first", None), ("second", None)]
    assert [(e.type, e.lease_id) for e in seen] == [("lease.granted", "A"), ("lease.granted", "B"),
                                                     ("lease.released", "A")]
    again = restart(url, backend)
    assert picture(again) == picture(s)
    again.store.close()


def test_a_refused_group_takes_every_change_made_on_it_since_with_it(setup):
    url, backend, store, s, seen, outcomes = setup
    s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    before, instances = picture(s), device_instances(backend)
    seen.clear()
    paused = PausedWrites(store)
    with store.hold():
        s.submit("bob", "kernel:b", MIG_3G, now=2, lease_id="B")  # a MIG instance made on the device
    s.after_group(lambda failed: outcomes.append(failed))
    store.fail_next.add("save")
    write, writer = start_writing(s)
    assert paused.started.wait(10)

    with store.hold():
        s.release("A", now=3)
        s.submit("carol", "kernel:c", SHARED, now=4, lease_id="C")  # may take what A gave back
    s.after_group(lambda failed: outcomes.append(failed))
    paused.go()
    writer.join()
    with pytest.raises(StoreFailed):
        s.settle_group(write)
    assert len(outcomes) == 2 and all(isinstance(failed, StoreFailed) for failed in outcomes)
    assert picture(s) == before and device_instances(backend) == instances
    assert seen == [] and not s.group_waiting

    s.submit("dave", "kernel:d", SHARED, now=5, lease_id="D")  # the core goes on from the stored state
    again = restart(url, backend)
    assert picture(again) == picture(s)
    for undone in ("B", "C"):
        with pytest.raises(NotFound):
            again.lease(undone)
    assert again.lease("A").state is LeaseState.GRANTED
    again.store.close()


def test_a_write_outside_the_group_waits_for_the_one_being_written_and_is_refused_with_it(setup):
    url, backend, store, s, seen, outcomes = setup
    paused = PausedWrites(store)
    with store.hold():
        s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    store.fail_next.add("save")
    write, writer = start_writing(s)
    assert paused.started.wait(10)
    with store.hold():
        s.submit("bob", "kernel:b", SHARED, now=2, lease_id="B")

    threading.Timer(0.2, paused.go).start()
    with pytest.raises(StoreFailed):  # written now, after the group it stands on, which is refused
        s.submit("carol", "kernel:c", SHARED, now=3, lease_id="C")
    writer.join()
    with pytest.raises(StoreFailed):
        s.settle_group(write)
    assert s.leases() == [] and store.load().leases == [] and seen == []

    s.submit("dave", "kernel:d", SHARED, now=4, lease_id="D")
    assert [l.id for l in store.load().leases] == ["D"]


def test_a_write_outside_the_group_after_a_written_one_announces_in_order(setup):
    url, backend, store, s, seen, outcomes = setup
    with store.hold():
        s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    write, writer = start_writing(s)
    with store.hold():
        s.submit("bob", "kernel:b", SHARED, now=2, lease_id="B")
    s.submit("carol", "kernel:c", SHARED, now=3, lease_id="C")  # settles the written group first
    writer.join()
    s.settle_group(write)  # settled already: nothing more
    assert [e.lease_id for e in seen] == ["A", "B", "C"]
    again = restart(url, backend)
    assert picture(again) == picture(s)
    again.store.close()


def test_an_instance_released_by_a_durable_group_and_taken_by_an_undone_change_is_destroyed(setup):
    url, backend, store, s, seen, outcomes = setup
    instance = s.submit("alice", "kernel:a", MIG_3G, now=1, lease_id="A").slice.mig_uuid
    paused = PausedWrites(store)
    with store.hold():
        s.release("A", now=2)
    write, writer = start_writing(s)
    assert paused.started.wait(10)
    with store.hold():
        taken = s.submit("bob", "kernel:b", MIG_3G, now=3, lease_id="B")
    assert taken.slice.mig_uuid == instance  # the released instance, before its release is durable
    paused.go()
    writer.join()
    s.settle_group(write)
    assert instance in device_instances(backend)  # B holds it

    store.fail_next.add("save")
    with pytest.raises(StoreFailed):
        s.commit_group()  # B's grant is refused: the instance's release stands, and it is destroyed
    assert instance not in device_instances(backend) and s.leases() == []
    s.submit("carol", "kernel:c", SHARED, now=4, lease_id="C")  # writes the record's removal
    again = restart(url, backend)
    assert picture(again) == picture(s)
    assert [r for r in again.store.load().instances if r.instance.uuid == instance] == []
    again.store.close()


def test_a_mig_intent_waits_for_the_group_being_written_only_on_sqlite(setup):
    url, backend, store, s, seen, outcomes = setup
    paused = PausedWrites(store)
    with store.hold():
        s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    write, writer = start_writing(s)
    assert paused.started.wait(10)
    threading.Timer(2.0, paused.go).start()  # long enough for a loaded machine to submit B first on a server
    with store.hold():
        s.submit("bob", "kernel:b", MIG_3G, now=2, lease_id="B")  # its intent is written before the device call
    on_a_server = not url.startswith("sqlite")
    # a server's intents have a connection of their own; SQLite's share the writer's, after the group
    assert paused.went.is_set() is not on_a_server
    writer.join()
    s.settle_group(write)
    s.commit_group()
    assert [l.id for l in store.load().leases] == ["A", "B"] and store.load().intents == []
