"""GroupCommit: a change answers once its group is durable; one that left nothing waiting, at once."""

from __future__ import annotations

import asyncio
import threading

import pytest
from sqlalchemy import event

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler, StoreFailed
from jupyter_gpualloc.core.store import Store, sqlite_url
from jupyter_gpualloc.service.group_commit import GroupCommit

from ..core.test_group_write import PausedWrites
from ..core.test_store_failures import FLEET, POLICY, SHARED, FlakyStore


def test_an_activity_only_touch_answers_at_once_unless_a_group_waits(tmp_path):
    store = Store(sqlite_url(tmp_path / "s.sqlite"))
    s = Scheduler(SimulatedBackend(FLEET), store, SchedulerPolicy(**POLICY))
    commits = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))

    async def main() -> None:
        group = GroupCommit(s)
        lease = await group.change(lambda: s.submit("alice", "kernel:a", SHARED, now=1))
        assert len(commits) == 1

        touch = asyncio.ensure_future(group.change(lambda: s.touch(lease.id, now=2, last_activity=2)))
        await asyncio.sleep(0)
        assert touch.done() and touch.result().last_activity == 2  # nothing to write, no turn waited for
        assert len(commits) == 1

        with store.hold():
            bob = s.submit("bob", "kernel:b", SHARED, now=3)  # another request's change, not yet durable
        touch = asyncio.ensure_future(group.change(lambda: s.touch(lease.id, now=4, last_activity=4)))
        await asyncio.sleep(0)
        assert not touch.done() and store.load_lease(bob.id) is None
        await touch  # answered only once what was waiting before it is durable
        assert store.load_lease(bob.id) is not None and len(commits) == 2

    asyncio.run(main())
    store.close()



def test_in_background_the_next_group_is_decided_while_one_is_written(tmp_path):
    store = Store(sqlite_url(tmp_path / "s.sqlite"))
    s = Scheduler(SimulatedBackend(FLEET), store, SchedulerPolicy(**POLICY))
    paused = PausedWrites(store)
    commits = []
    event.listen(store.engine, "commit", lambda conn: commits.append(threading.get_ident()))

    async def main() -> None:
        group = GroupCommit(s, in_background=True)
        alice = asyncio.ensure_future(group.change(lambda: s.submit("alice", "kernel:a", SHARED, now=1)))
        await asyncio.to_thread(paused.started.wait, 10)  # its transaction is open on the writer thread
        bob = asyncio.ensure_future(group.change(lambda: s.submit("bob", "kernel:b", SHARED, now=2)))
        await asyncio.sleep(0.05)
        assert not alice.done() and not bob.done()
        assert [l.user for l in s.leases()] == ["alice", "bob"]  # bob's grant decided, not yet answered
        paused.go()
        first, second = await alice, await bob
        assert store.load_lease(first.id) is not None and store.load_lease(second.id) is not None
        group.close()

    asyncio.run(main())
    assert len(commits) == 2 and threading.get_ident() not in commits  # one transaction per group, off the loop
    store.close()


def test_in_background_a_refused_group_fails_the_changes_decided_on_it(tmp_path):
    store = FlakyStore(sqlite_url(tmp_path / "s.sqlite"))
    s = Scheduler(SimulatedBackend(FLEET), store, SchedulerPolicy(**POLICY))
    paused = PausedWrites(store)

    async def main() -> None:
        group = GroupCommit(s, in_background=True)
        store.fail_next.add("save")
        alice = asyncio.ensure_future(group.change(lambda: s.submit("alice", "kernel:a", SHARED, now=1)))
        await asyncio.to_thread(paused.started.wait, 10)
        bob = asyncio.ensure_future(group.change(lambda: s.submit("bob", "kernel:b", SHARED, now=2)))
        await asyncio.sleep(0.05)
        paused.go()
        for answer in (alice, bob):
            with pytest.raises(StoreFailed):
                await answer
        assert s.leases() == []
        carol = await group.change(lambda: s.submit("carol", "kernel:c", SHARED, now=3))
        assert [l.id for l in store.load().leases] == [carol.id]
        group.close()

    asyncio.run(main())
    store.close()
