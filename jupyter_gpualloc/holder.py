"""A holder's life with its lease, written once for every kind of holder.

Every holder (a JupyterHub server, a kernel, a job's runner, a kernel's or a job's pod) asks for a
slice, waits in the queue, keeps its lease alive while it runs and ends it. Two parts of that are
the same whoever holds the lease, and live here only:

- `wait_in_queue`: the wait of a queued request. Each round it tells the holder's own display (the
  spawn page, the cell, the server's log) where the request stands, with the core's reason and how
  long the wait may still last; it gives up at the holder's patience with `WaitGaveUp`.
- `Keepalive`: one heartbeat loop per client for all the holders it keeps. A holder kind supplies
  only how to prove it still runs (`running`) and what to do when it ended (`on_ended`) or when its
  lease ended at the service (`on_lost`). A process whose own rounds already call the service (the
  server's activity report, the job runner) calls `beat()` from its round instead of `start()`.

What a granted lease means for a process (its environment) is `lease_env.py`'s.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

QUEUED = "queued"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Waiting:
    """Where a waiting request stands, as one round of `wait_in_queue` sees it."""

    view: dict  # the lease (or the kernel pod) as the service last answered
    waited: float  # seconds since the wait began
    left: float  # seconds until it gives up (inf: never)

    @property
    def position(self) -> int | None:
        return self.view.get("position")

    @property
    def reason(self) -> str:
        """The core's reason the request waits (quota, reservation, no fitting GPU), or ""."""
        return self.view.get("reason") or ""


class WaitGaveUp(Exception):
    """The request was still queued when the holder's patience ran out."""

    def __init__(self, waiting: Waiting):
        super().__init__(f"still queued after {waiting.waited:.0f} s (position {waiting.position})")
        self.waiting = waiting


def is_queued(view: dict) -> bool:
    return view.get("state") == QUEUED


async def wait_in_queue(read: Callable[[dict], Awaitable[dict]], view: dict, *, patience: float = math.inf,
                        waiting: Callable[[dict], bool] = is_queued, patience_applies: Callable[[dict], bool] = is_queued,
                        on_round: Callable[[Waiting], Any] | None = None, poll: float = 1.0,
                        first_poll: float | None = None, beat: Callable[[], Awaitable[Any]] | None = None,
                        beat_every: float = math.inf, clock: Callable[[], float] = time.monotonic) -> dict:
    """Poll `view` (through `read`) while `waiting(view)`; the view that ends the wait.

    Each round calls `on_round(Waiting)` first (it may be async). Past `patience` seconds, while
    `patience_applies(view)` (by default: still queued; a pod already starting is waited for),
    raises WaitGaveUp: withdrawing the request is the caller's choice. The pause between reads
    starts at `first_poll` (default `poll`) and doubles up to `poll`. `beat` (a heartbeat of the
    waiting holder) is called every `beat_every` seconds of waiting.
    """
    started = last_beat = clock()
    pause = first_poll if first_poll is not None else poll
    while waiting(view):
        now = clock()
        state = Waiting(view, now - started, patience - (now - started))
        if on_round is not None:
            said = on_round(state)
            if inspect.isawaitable(said):
                await said
        if state.left <= 0 and patience_applies(view):
            raise WaitGaveUp(state)
        await asyncio.sleep(max(0.0, min(pause, state.left)) if patience_applies(view) else pause)
        pause = min(2 * pause, poll)
        if beat is not None and clock() - last_beat >= beat_every:
            await beat()
            last_beat = clock()
        view = await read(view)
    return view


@dataclass
class Kept:
    """A holder a `Keepalive` keeps, with how its kind proves it alive and reacts to its end."""

    holder: str
    lease_id: str | None = None  # the lease whose absence from a heartbeat's answer means it ended
    running: Callable[[], Awaitable[bool]] | None = None  # None: the holder is this very process
    on_ended: Callable[[str], Any] | None = None  # its process ended (`running` said False)
    on_lost: Callable[[str], Any] | None = None  # its lease ended at the service


class Keepalive:
    """One heartbeat for all the holders a client keeps: every `interval` seconds (`start`), or at
    each round of a caller that already polls (`beat`). A heartbeat that fails is logged and
    tried again next time: the service's heartbeat TTL is several intervals long."""

    def __init__(self, heartbeat: Callable[[list[str]], Awaitable[list[dict]]], interval: float = math.inf, *,
                 log: logging.Logger | logging.LoggerAdapter = log, what: str = "gpualloc"):
        self.heartbeat = heartbeat
        self.interval = interval
        self.log = log
        self.what = what
        self.kept: dict[str, Kept] = {}
        self._task: asyncio.Task | None = None

    def keep(self, holder: str, **how: Any) -> None:
        self.kept[holder] = Kept(holder, **how)

    def forget(self, holder: str) -> None:
        self.kept.pop(holder, None)

    def keep_only(self, holders: set[str]) -> None:
        """Keep exactly `holders` (plain ones, this process's own): for a round that knows them all."""
        for holder in set(self.kept) - holders:
            self.forget(holder)
        for holder in holders - set(self.kept):
            self.keep(holder)

    @property
    def holders(self) -> list[str]:
        return sorted(self.kept)

    def start(self) -> None:
        """Beat every `interval` seconds from now on (the first beat after one interval)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop())

    def stop(self) -> None:
        """No more beats. From inside a beat's own callback the beat finishes, then the loop ends."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _loop(self) -> None:
        me = asyncio.current_task()
        while self._task is me:
            await asyncio.sleep(self.interval)
            if self._task is not me:
                return
            await self.beat()

    async def beat(self, *, strict: bool = False) -> list[dict] | None:
        """Prove each holder alive, heartbeat the living ones in one call; the leases the service
        answered, or None when the call failed (`strict`: its error is raised, for a round that
        reports the service's availability). Callbacks of ended holders run before it returns."""
        for kept in list(self.kept.values()):
            if kept.running is not None and not await kept.running():
                self.forget(kept.holder)
                await _call(kept.on_ended, kept.holder)
        if not self.kept:
            return []
        holders = self.holders
        try:
            answer = await self.heartbeat(holders)
        except Exception as err:  # the service may be restarting: the next beat tries again
            if strict:
                raise
            self.log.warning("%s: heartbeat of %s failed: %s", self.what, ", ".join(holders), err)
            return None
        alive = {lease["id"] for lease in answer}
        for kept in list(self.kept.values()):
            if kept.lease_id and kept.lease_id not in alive and kept.holder in holders:
                self.forget(kept.holder)
                await _call(kept.on_lost, kept.holder)
        return answer


async def _call(callback: Callable[[str], Any] | None, holder: str) -> None:
    if callback is None:
        return
    result = callback(holder)
    if inspect.isawaitable(result):
        await result
