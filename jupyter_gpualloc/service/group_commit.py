"""Group commit: the core's writes of one IOLoop turn share one transaction and one fsync.

A handler runs its core change with the store holding writes (`Store.hold()`), then waits; the
first change of a turn schedules the group's commit for the next turn, which writes every change
waiting by then in one transaction and wakes their handlers. A change that left nothing waiting
(and found nothing waiting) answers at once. An answer is still sent only once its change is
durable; if the store refuses the group, the core undoes every change in it, newest first, and
each waiting handler raises StoreFailed (answered 503 like any refused write).

`in_background`: the group's transaction runs on a thread of its own while the IOLoop goes on
deciding the next group's changes, which stand on it (`Scheduler.take_group`): where a commit
waits on a database server's fsync, the IOLoop no longer waits with it. One group is written at
a time; if the store refuses one, the changes made since are undone with it and answered 503 too.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from ..core.errors import StoreFailed
from ..core.journal import GroupWrite
from ..core.scheduler import Scheduler

T = TypeVar("T")


class GroupCommit:
    """Runs core changes into the waiting group and commits the group once per IOLoop turn (or,
    `in_background`, as soon as the group before it is written)."""

    def __init__(self, scheduler: Scheduler, *, in_background: bool = False):
        self.scheduler = scheduler
        self._scheduled = False
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="group-commit") if in_background else None
        self._writing: GroupWrite | None = None

    async def change(self, call: Callable[[], T], *, outlives_refusal: bool = False) -> T:
        """`call()` (one core change) with its writes in the group; returns once the group is
        durable, raises StoreFailed (the change undone) if the store refused it, unless the change
        `outlives_refusal` (a heartbeat: alive in memory, its accrual written later)."""
        with self.scheduler.hold_group():
            result = call()
        if not self.scheduler.group_waiting:
            return result  # it wrote nothing, and everything before it is durable (an activity-only touch)
        loop = asyncio.get_running_loop()
        durable = loop.create_future()

        def settle(failed: StoreFailed | None) -> None:
            if not durable.done():
                durable.set_exception(failed) if failed else durable.set_result(None)
        self.scheduler.after_group(settle)
        self._commit_soon(loop)
        try:
            await durable
        except StoreFailed:
            if not outlives_refusal:
                raise
        return result

    def close(self) -> None:
        """Settle the group being written, if any (waiting for its write), and end the writer thread."""
        writing, self._writing = self._writing, None
        if writing is not None:
            self._settle(writing)
        if self._writer is not None:
            self._writer.shutdown(wait=True)

    def _commit_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._commit)

    def _commit(self) -> None:
        if self._writing is not None:
            return  # still scheduled: _written() commits once the group before is settled
        self._scheduled = False
        if self._writer is None:
            try:
                self.scheduler.commit_group()
            except StoreFailed:
                pass  # every change of the group was undone and its handler answers the failure
            return
        write = self.scheduler.take_group()
        if write.taken is None:  # events and callbacks only: nothing for the thread to write
            self._settle(write)
            return
        self._writing = write
        loop = asyncio.get_running_loop()
        self._writer.submit(write.write).add_done_callback(
            lambda _: loop.call_soon_threadsafe(self._written, write))

    def _written(self, write: GroupWrite) -> None:
        if self._writing is not write:
            return  # settled by close()
        self._writing = None
        self._settle(write)
        self._scheduled = False
        if self.scheduler.group_waiting:
            self._commit_soon(asyncio.get_running_loop())

    def _settle(self, write: GroupWrite) -> None:
        try:
            self.scheduler.settle_group(write)
        except StoreFailed:
            pass  # every change since was undone and its handler answers the failure
