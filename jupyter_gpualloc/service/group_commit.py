"""Group commit: the core's writes of one IOLoop turn share one transaction and one fsync.

A handler runs its core change with the store holding writes (`Store.hold()`), then waits; the
first change of a turn schedules `Scheduler.commit_group()` for the next turn, which writes every
change waiting by then in one transaction and wakes their handlers. A change that left nothing
waiting (and found nothing waiting) answers at once. An answer is still sent only
once its change is durable; if the store refuses the group, the core undoes every change in it,
newest first, and each waiting handler raises StoreFailed (answered 503 like any refused write).
"""

from __future__ import annotations

import asyncio
from typing import Callable, TypeVar

from ..core.errors import StoreFailed
from ..core.scheduler import Scheduler

T = TypeVar("T")


class GroupCommit:
    """Runs core changes into the waiting group and commits the group once per IOLoop turn."""

    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self._scheduled = False

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
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._commit)
        try:
            await durable
        except StoreFailed:
            if not outlives_refusal:
                raise
        return result

    def _commit(self) -> None:
        self._scheduled = False
        try:
            self.scheduler.commit_group()
        except StoreFailed:
            pass  # every change of the group was undone and its handler answers the failure
