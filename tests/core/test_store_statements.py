"""The store's writes run as SQL compiled once per dialect (driver SQL, no per-write compile):
every value goes in and comes back as it was, on SQLite and PostgreSQL, and a refused group
writes none of its rows."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from jupyter_gpualloc.core.model import (Job, JobState, Lease, LeaseState, MigInstance, PriorityClass, Slice,
                                         SliceKind, SliceSpec)
from jupyter_gpualloc.core.store import DeadlineRecord, MigIntent, Store, StoreError, UsageSegment

MIG_SPEC = SliceSpec.from_json({"kind": "mig", "profile": "1g.10gb", "model": "A100-SXM4-80GB"})
MIG_SLICE = Slice(kind=SliceKind.MIG, node="node0", gpu_uuids=("GPU-0",), memory_mib=9984, profile="1g.10gb",
                  start=3, mig_uuid="MIG-7", milli=142, model="A100-SXM4-80GB", gpu_memory_mib=81920)


def full_lease(lease_id: str, **changes) -> Lease:
    """A granted lease with every optional field set, booleans true, text beyond ASCII."""
    fields = dict(id=lease_id, user="zoë", holder="kernel:漢字", spec=MIG_SPEC, priority=PriorityClass.BATCH,
                  state=LeaseState.GRANTED, created_at=1.25, seq=7, groups=("ml", "staff"), preemptible=True,
                  slice=MIG_SLICE, granted_at=2.5, ended_at=None, last_activity=3.75, busy=True,
                  idle_warned_at=4.0, idle_timeout=600.0, reason="warned — idle")
    fields.update(changes)
    return Lease(**fields)


@pytest.fixture
def store(store_urls):
    made = Store(store_urls.fresh())
    yield made
    made.close()


def test_every_value_comes_back_as_it_was_written(store):
    full = full_lease("A")
    bare = Lease(id="B", user="bob", holder="server", spec=SliceSpec.from_json({"kind": "shared", "memory_gib": 8}),
                 priority=PriorityClass.INTERACTIVE, state=LeaseState.QUEUED, created_at=5, seq=8)
    ended = full_lease("C", state=LeaseState.RELEASED, ended_at=9.5, busy=False, preemptible=False)
    instance = MigInstance(uuid="MIG-7", profile_id=19, start=3, size=1, gi_id=11, ci_id=0)
    store.save([full, bare, ended], [("GPU-0", "MIG-7", instance, True)], 8, drains={"GPU-1": True})
    segment = UsageSegment("A", 2.5, 3.5, "1970-01-01", "zoë", ("ml",), "A100-SXM4-80GB", "mig", "small",
                           "kernel", 1 / 7, 9.75)
    store.save_usage([segment])
    store.add_busy("A", "1970-01-01", "zoë", 0.5, 1.0)
    store.add_busy("A", "1970-01-01", "zoë", 0.25, 1.0)  # the upsert adds
    store.save([], [], 8, deadlines={"A": DeadlineRecord("A", 100.5, 2, None)})
    store.save([], [], 8, deadlines={"A": DeadlineRecord("A", 200.5, 3, 150.0)})  # replaces
    job = Job(id="J", user="zoë", name="train", spec=MIG_SPEC, priority=PriorityClass.BATCH, preemptible=True,
              source={"kind": "cell", "code": "print('ü')"}, workdir="w", kernel_name="python3",
              state=JobState.QUEUED, created_at=6.0)
    store.save_jobs([job])

    state = store.load()
    assert sorted(state.leases, key=lambda lease: lease.id) == [full, bare]
    assert store.load_lease("C") == ended
    assert [(r.gpu_uuid, r.instance, r.created_by_core) for r in state.instances] == [("GPU-0", instance, True)]
    assert state.drained == ["GPU-1"] and state.seq == 8
    assert store.load_usage(0, 10) == [segment]
    assert store.load_busy("1970-01-01", "1970-01-01") == {"A": 0.75}
    assert store.load_deadlines() == [DeadlineRecord("A", 200.5, 3, 150.0)]
    assert store.load_jobs() == [job]

    store.save([], [("GPU-0", "MIG-7", None, True)], 9, drains={"GPU-1": False}, deadlines={"A": None})
    state = store.load()
    assert state.instances == [] and state.drained == [] and state.seq == 9
    assert store.load_deadlines() == []


def test_intents_are_forgotten_by_id(store):
    for name in "abcd":
        store.record_intent(MigIntent(name, "GPU-0", 19, 0))
    store.clear_intents(["a", "c"])
    assert [i.id for i in store.load().intents] == ["b", "d"]
    store.save([], [], 1, intents_done=["d"])
    assert [i.id for i in store.load().intents] == ["b"]
    store.clear_intents([])
    assert [i.id for i in store.load().intents] == ["b"]


def test_an_intent_is_one_statement_and_on_a_server_commits_without_waiting_for_the_flush(store):
    sent = []
    for engine in {store.engine, store._intent_engine}:
        event.listen(engine, "before_cursor_execute", lambda conn, cursor, sql, *args: sent.append(sql.split()[0]))
    store.record_intent(MigIntent("a", "GPU-0", 19, 0))
    assert sent == ["INSERT"]  # no SET, no BEGIN: the statement commits by itself
    if store.url.startswith("postgresql"):
        setting = "SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'"
        with store._intent_engine.connect() as intents, store.engine.connect() as groups:
            assert tuple(intents.exec_driver_sql(setting).one()) == ("off", "session")
            # groups stay as durable as the server is set up to be: the store leaves their setting alone
            assert groups.exec_driver_sql(setting).one().source != "session"
    assert [i.id for i in store.load().intents] == ["a"]


def test_a_group_whose_second_row_is_refused_writes_none_of_it(store):
    store.save([full_lease("A")], [], 1)
    with store.hold():
        store.save([full_lease("A", last_activity=50.0), full_lease("B")], [], 2)
        store.save([full_lease("C", reason="bye \ud800")], [], 3)  # a value the database cannot take
        store.record_intent(MigIntent("i", "GPU-0", 19, 0))  # its own transaction, not the group's
    with pytest.raises(StoreError):
        store.commit_group()
    state = store.load()
    assert [(lease.id, lease.last_activity) for lease in state.leases] == [("A", 3.75)] and state.seq == 1
    assert [i.id for i in state.intents] == ["i"]
    store.save([full_lease("B")], [], 4)  # the store goes on
    assert sorted(lease.id for lease in store.load().leases) == ["A", "B"]


def test_a_groups_writes_are_precompiled_and_its_leases_one_executemany(store):
    statements = []
    event.listen(store.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, parameters, context, executemany:
                 statements.append((" ".join(statement.split()[:3]), context.compiled is None, executemany)))
    with store.hold():
        store.save([full_lease("A"), full_lease("B")], [("GPU-0", "MIG-7", MigInstance("MIG-7", 19, 3, 1), True)], 1)
        store.save([full_lease("A", last_activity=9.0)], [], 2, intents_done=["x", "y"])
    store.commit_group()
    assert statements == [
        ("INSERT INTO leases", True, True),  # A and B, each once, as it was last
        ("INSERT INTO mig_instances", True, False),
        ("DELETE FROM mig_intents", True, True),  # x and y, one id a row
        ("INSERT INTO meta", True, False),
    ]
    assert {lease.id: lease.last_activity for lease in store.load().leases} == {"A": 9.0, "B": 3.75}
