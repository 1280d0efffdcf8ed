"""Group commit: changes made while the store holds writes are written in one transaction, announced
only then, and all undone (devices included) when the store refuses the group."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import NotFound, Scheduler, StoreFailed
from jupyter_gpualloc.core.store import Store, sqlite_url

from .test_store_failures import FLEET, MIG_3G, POLICY, SHARED, FlakyStore, device_instances, flaky_scheduler, picture, restart


@pytest.fixture
def setup(store_urls):
    url, backend, store, s = flaky_scheduler(store_urls)
    commits = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    yield url, backend, store, s, commits
    store.close()


def test_held_changes_are_written_in_one_transaction_and_announced_after_it(setup):
    url, backend, store, s, commits = setup
    s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    seen, outcomes = [], []
    s.subscribe(seen.append)
    commits.clear()
    with store.hold():
        s.submit("bob", "kernel:b", SHARED, now=2, lease_id="B")
        s.touch("A", now=3, last_activity=3)
        s.release("A", now=4)
    s.after_group(outcomes.append)
    assert commits == [] and seen == [] and outcomes == []
    assert store.load_lease("B") is None  # not written yet: nothing is answered or announced before it is

    s.commit_group()
    assert len(commits) == 1 and outcomes == [None]
    assert [e.type for e in seen] == ["lease.granted", "lease.released"]
    again = restart(url, backend)
    assert picture(again) == picture(s)
    assert again.lease("A").state is LeaseState.RELEASED
    again.store.close()


def test_a_refused_group_undoes_every_change_in_it_devices_included(setup):
    url, backend, store, s, commits = setup
    s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    before, instances = picture(s), device_instances(backend)
    seen, outcomes = [], []
    s.subscribe(seen.append)
    with store.hold():
        s.submit("bob", "kernel:b", MIG_3G, now=2, lease_id="B")  # makes a MIG instance on the device
        s.submit("carol", "kernel:c", SHARED, now=3, lease_id="C")
        s.release("A", now=4)
    s.after_group(outcomes.append)
    assert device_instances(backend) != instances

    store.fail_next.add("save")
    with pytest.raises(StoreFailed):
        s.commit_group()
    assert len(outcomes) == 1 and isinstance(outcomes[0], StoreFailed)
    assert picture(s) == before and device_instances(backend) == instances
    assert seen == []
    assert s.lease("A").state is LeaseState.GRANTED

    s.submit("dave", "kernel:d", SHARED, now=5, lease_id="D")  # the core goes on from the stored state
    again = restart(url, backend)
    assert picture(again) == picture(s)
    for refused in ("B", "C"):
        with pytest.raises(NotFound):
            again.lease(refused)
    again.store.close()


def test_a_write_outside_the_group_takes_the_waiting_group_with_it(setup):
    url, backend, store, s, commits = setup
    outcomes = []
    with store.hold():
        s.submit("bob", "kernel:b", SHARED, now=2, lease_id="B")
    s.after_group(outcomes.append)
    commits.clear()
    s.submit("carol", "kernel:c", SHARED, now=3, lease_id="C")  # not held: written now, after bob's
    assert len(commits) == 1 and outcomes == [None]
    again = restart(url, backend)
    assert {l.id for l in again.leases()} == {"B", "C"}
    again.store.close()


def test_a_refused_group_leaves_a_heartbeats_accrual_to_the_next_heartbeat(setup):
    url, backend, store, s, commits = setup
    midnight = 86400.0 * 20000
    s.submit("alice", "kernel:a", SHARED, now=midnight - 50, lease_id="A")
    with store.hold():
        s.heartbeat("alice", now=midnight + 50)  # accrual over two UTC days, waiting in the group
        s.submit("bob", "kernel:b", SHARED, now=midnight + 50, lease_id="B")
    store.fail_next.add("save")
    with pytest.raises(StoreFailed):
        s.commit_group()
    assert store.load_usage(0, float("inf"), "alice") == []

    s.heartbeat("alice", now=midnight + 100)
    stored = store.load_usage(0, float("inf"), "alice")
    assert [(seg.start, seg.end) for seg in stored] == [(midnight - 50, midnight), (midnight, midnight + 100)]


@pytest.mark.parametrize("level, value", [("NORMAL", 1), ("FULL", 2)])
def test_sqlite_commits_are_synced_as_configured(tmp_path, level, value):
    store = Store(sqlite_url(tmp_path / "s.sqlite"), sqlite_synchronous=level)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == value
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.close()
    with pytest.raises(ValueError):
        Store(sqlite_url(tmp_path / "t.sqlite"), sqlite_synchronous="OFF")


def test_a_touch_that_only_moves_activity_is_written_by_write_activity(setup):
    url, backend, store, s, commits = setup
    s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    commits.clear()
    for t in (10, 20, 30):
        s.touch("A", now=t, last_activity=t)
    assert commits == [] and s.lease("A").last_activity == 30
    assert store.load_lease("A").last_activity == 1  # what a restart would go on from

    store.fail_next.add("save")
    s.write_activity(now=31)  # refused: kept for the next call
    assert store.load_lease("A").last_activity == 1 and s.lease("A").last_activity == 30
    s.write_activity(now=32)
    assert store.load_lease("A").last_activity == 30
    assert [(seg.start, seg.end) for seg in store.load_usage(0, 100, "alice")] == [(1, 32)]
    commits.clear()
    s.write_activity(now=33)
    assert commits == []  # nothing new to write

    s.touch("A", now=40, busy=True)  # more than activity: written at once
    assert store.load_lease("A").busy


def test_a_released_instance_is_destroyed_only_once_its_group_is_durable(setup):
    url, backend, store, s, commits = setup
    granted = s.submit("alice", "kernel:a", MIG_3G, now=1, lease_id="A")
    instance = granted.slice.mig_uuid
    seen = []
    s.subscribe(seen.append)
    commits.clear()
    with store.hold():
        s.release("A", now=2)
    assert commits == [] and instance in device_instances(backend)  # nothing destroyed before the group is written

    s.commit_group()
    assert len(commits) == 1 and instance not in device_instances(backend)
    assert [e.type for e in seen] == ["lease.released"]  # the record's removal waits for the next commit
    s.submit("bob", "kernel:b", SHARED, now=3, lease_id="B")
    assert [e.type for e in seen] == ["lease.released", "mig.destroyed", "lease.granted"]
    again = restart(url, backend)
    assert picture(again) == picture(s)
    assert [e for e in again.store.load().instances if e.instance.uuid == instance] == []
    again.store.close()


def test_a_grant_in_the_same_group_takes_the_released_instance_instead_of_making_one(setup):
    url, backend, store, s, commits = setup
    instance = s.submit("alice", "kernel:a", MIG_3G, now=1, lease_id="A").slice.mig_uuid
    with store.hold():
        s.release("A", now=2)
        taken = s.submit("bob", "kernel:b", MIG_3G, now=2, lease_id="B")
    s.commit_group()
    assert taken.slice.mig_uuid == instance and instance in device_instances(backend)
    again = restart(url, backend)
    assert again.lease("B").slice.mig_uuid == instance and picture(again) == picture(s)
    again.store.close()


def test_a_refused_group_keeps_the_instance_it_released_with_its_lease(setup):
    url, backend, store, s, commits = setup
    instance = s.submit("alice", "kernel:a", MIG_3G, now=1, lease_id="A").slice.mig_uuid
    before = picture(s)
    with store.hold():
        s.release("A", now=2)
    store.fail_next.add("save")
    with pytest.raises(StoreFailed):
        s.commit_group()
    assert picture(s) == before and instance in device_instances(backend)
    assert s.lease("A").state is LeaseState.GRANTED


def test_recovery_destroys_an_instance_whose_release_was_durable_before_a_crash(setup):
    url, backend, store, s, commits = setup
    instance = s.submit("alice", "kernel:a", MIG_3G, now=1, lease_id="A").slice.mig_uuid
    with store.hold():
        s.release("A", now=2)
    store.commit_group()  # the group is durable; the process dies before the core destroys the instance
    assert instance in device_instances(backend)

    seen = []
    again = Scheduler(backend, Store(url), SchedulerPolicy(**POLICY), now=1000, listeners=[seen.append])
    assert instance not in device_instances(backend)
    assert [(e.type, e.data["instance"]) for e in seen if e.type.startswith("mig.")] == [("mig.destroyed", instance)]
    assert again.store.load().instances == [] and again.leases() == []
    again.store.close()


def test_a_preemption_in_a_group_makes_its_room_at_once(store_urls):
    url = store_urls.fresh()
    backend = SimulatedBackend(FLEET)
    store = Store(url)
    s = Scheduler(backend, store, SchedulerPolicy(heartbeat_ttl=0, preemption=True, wait_for_holders=False))
    whole = SliceSpec.from_json({"kind": "mig", "profile": "7g.40gb"})
    s.submit("alice", "job:a", whole, PriorityClass.BATCH, now=1, lease_id="A", preemptible=True)
    with store.hold():
        urgent = s.submit("bob", "kernel:b", MIG_3G, now=2, lease_id="B")
    assert urgent.state is LeaseState.GRANTED and s.lease("A").state is LeaseState.PREEMPTED
    s.commit_group()
    again = restart(url, backend)
    assert again.lease("B").slice.mig_uuid == urgent.slice.mig_uuid and device_instances(backend) == {urgent.slice.mig_uuid}
    again.store.close()
    store.close()


def test_a_refused_group_keeps_the_removal_of_an_instance_destroyed_before_it(setup):
    url, backend, store, s, commits = setup
    instance = s.submit("alice", "kernel:a", MIG_3G, now=1, lease_id="A").slice.mig_uuid
    with store.hold():
        s.release("A", now=2)
    s.commit_group()  # destroyed; the record's removal waits for the next commit
    with store.hold():
        s.submit("bob", "kernel:b", SHARED, now=3, lease_id="B")
    store.fail_next.add("save")
    with pytest.raises(StoreFailed):
        s.commit_group()
    assert instance in {r.instance.uuid for r in store.load().instances}

    s.submit("carol", "kernel:c", SHARED, now=4, lease_id="C")
    assert instance not in {r.instance.uuid for r in store.load().instances}
    seen = []
    again = Scheduler(backend, Store(url), SchedulerPolicy(**POLICY), now=1000, listeners=[seen.append])
    assert not [e for e in seen if e.type.startswith("reconcile.")]
    again.store.close()


def test_heartbeats_in_one_group_write_each_segment_once_as_it_was_last(setup):
    url, backend, store, s, commits = setup
    s.submit("alice", "kernel:a", SHARED, now=1, lease_id="A")
    s.submit("alice", "kernel:b", SHARED, now=1, lease_id="B")
    usage_statements = []
    event.listen(store.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: usage_statements.append(statement)
                 if statement.lstrip().startswith("INSERT INTO usage") else None)
    with store.hold():
        for t in (5, 6, 7):
            s.heartbeat("alice", now=t)
    s.commit_group()
    assert len(usage_statements) == 1  # one statement for the group's segments, not one per heartbeat
    stored = store.load_usage(0, float("inf"), "alice")
    assert sorted((seg.lease_id, seg.start, seg.end) for seg in stored) == [("A", 1, 7), ("B", 1, 7)]


def test_sqlite_writes_share_one_connection_that_outlives_a_refused_write(tmp_path):
    store = FlakyStore(sqlite_url(tmp_path / "s.sqlite"))
    s = Scheduler(SimulatedBackend(FLEET), store, SchedulerPolicy(**POLICY))
    checkouts = []
    event.listen(store.engine.pool, "checkout", lambda *args: checkouts.append(1))
    s.submit("alice", "kernel:a", SHARED, now=1)
    store.fail_next.add("save")
    with pytest.raises(StoreFailed):
        s.submit("bob", "kernel:b", SHARED, now=2)
    carol = s.submit("carol", "kernel:c", SHARED, now=3)
    assert len(checkouts) == 1  # three transactions (one refused) on the connection taken once
    assert store.load_lease(carol.id).state is LeaseState.GRANTED
    assert [l.user for l in store.load().leases] == ["alice", "carol"]
    store.close()
