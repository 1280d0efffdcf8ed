"""GroupCommit: a change answers once its group is durable; one that left nothing waiting, at once."""

from __future__ import annotations

import asyncio

from sqlalchemy import event

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store, sqlite_url
from jupyter_gpualloc.service.group_commit import GroupCommit

from ..core.test_store_failures import FLEET, POLICY, SHARED


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

