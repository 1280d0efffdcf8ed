"""HolderLease: one holder's lease from its request to its end, the same for every kind of holder.

Shaped like JupyterHub's Spawner, whose interface every spawner shares while each supplies only
how it starts a process:

    lease = HolderLease(client, "kernel:<id>", running=kernel_runs)
    await lease.acquire("a100-1g")           # an offer's name, or acquire(spec={...})
    await lease.wait(patience=300, on_round=tell)   # position, the core's reason, the deadline
    env = lease.env(service_url=...)         # what the slice means for a process
    lease.keepalive(keeper)                  # joins the process's one holder.Keepalive
    await lease.report_activity(busy=True)   # a person's activity (touch)
    await lease.release(gone=True)           # gone: the holder is proven ended, its slice returns
    state = lease.get_state(); lease.load_state(state)   # across a restart of the client

A kind of holder supplies only how it proves itself alive (`running`, used by the keepalive) and
how it applies a slice (its own use of `env()` or of the granted lease). Each client keeps its own
words for what goes wrong (a spawn error, a magic's one line, a provisioner's exception): the
lease raises the client's errors (client.py) and `holder.WaitGaveUp` as they come.
"""

from __future__ import annotations

import math
import time
from typing import Any, Awaitable, Callable

from .core.holders import JOB, kind_of
from .holder import Keepalive, Waiting, wait_in_queue
from .lease_env import slice_env

GRANTED = "granted"
ACTIVE = ("queued", GRANTED)


class HolderLease:
    """The lease of one holder (`server`, `kernel:<id>`, `job:<id>`) through one service client.

    `client` is a GpuAllocClient, or a function returning one (made on first use, or made again
    after it was closed). `running` is the holder's proof of life for the keepalive (None: the
    holder is the process that keeps it).
    """

    def __init__(self, client: Any, holder: str, *, running: Callable[[], Awaitable[bool]] | None = None):
        self._client = client
        self.holder = holder
        self.running = running
        self.lease_id = ""
        self.view: dict | None = None  # the lease as the service last answered
        self.gives_up_at: float | None = None  # wall-clock second the current wait gives up (None: never)
        self.keeper: Keepalive | None = None

    @property
    def client(self):
        return self._client() if callable(self._client) else self._client

    @client.setter
    def client(self, client: Any) -> None:
        self._client = client

    @property
    def granted(self) -> bool:
        return self.view is not None and self.view.get("state") == GRANTED

    def _took(self, view: dict | None) -> dict | None:
        self.view = view
        self.lease_id = view["id"] if view else ""
        return view

    # ------------------------------------------------------------ asking
    async def acquire(self, offer: str | None = None, *, spec: dict | None = None, priority: str = "interactive",
                      idle_timeout: float | None = None, wait: float | None = None) -> dict:
        """Ask for a slice: by an offer's name (its terms are the admin's) or by a spec the core maps
        to one. Granted now, or queued (`wait` None), or NoCapacity at once (`wait` 0)."""
        return self._took(await self.client.request_lease(spec, self.holder, offer=offer, priority=priority,
                                                          idle_timeout=idle_timeout, wait=wait))

    async def find(self) -> dict | None:
        """The holder's queued or granted lease at the service, however it was asked for (a restart
        finds the one it had), taken as this lease; None when it holds none."""
        mine = [lease for lease in await self.client.leases()
                if lease["holder"] == self.holder and lease["state"] in ACTIVE]
        return self._took(mine[-1] if mine else None)

    def adopt(self, view: dict) -> dict:
        """A lease asked for elsewhere (a job's, submitted with it), taken as this holder's."""
        return self._took(dict(view))

    async def read(self) -> dict | None:
        """The lease as the service knows it now (None when it knows it no more)."""
        from .client import NotFound

        if not self.lease_id:
            return None
        try:
            return self._took(await self.client.lease(self.lease_id))
        except NotFound:
            return None

    # ------------------------------------------------------------ waiting
    async def wait(self, *, patience: float = math.inf, on_round: Callable[[Waiting], Any] | None = None,
                   poll: float = 1.0, keeper: Keepalive | None = None, beat_every: float = math.inf,
                   on_unavailable: Callable[[Exception], Any] | None = None,
                   read: Callable[[dict], Awaitable[dict]] | None = None, view: dict | None = None,
                   **waiting: Any) -> dict:
        """Wait while the lease is queued (holder.wait_in_queue): each round tells `on_round` its
        position, the core's reason and how long the wait may still last (`gives_up_at` is the
        deadline it states, on the wall clock). Past `patience` seconds WaitGaveUp is raised: the
        caller withdraws (`release()`) and says so in its own words. A lease the service no longer
        knows ends the wait as 'gone'. `on_unavailable`: the service cannot answer now (it
        restarts): told, and asked again next round; without it the error is raised. While it
        waits, `keeper` (the process's Keepalive) heartbeats the holder every `beat_every` seconds:
        it has no process to prove alive yet.

        A holder whose request the service serves as something else (a kernel's pod) waits on that:
        `read` reads its view (starting from `view`), and `waiting` are wait_in_queue's (waiting,
        patience_applies, first_poll); the view that ended the wait is returned as it is."""
        from .client import NotFound, ServiceUnavailable

        self.gives_up_at = time.time() + patience if patience != math.inf else None

        async def read_lease(view: dict) -> dict:
            try:
                return await self.client.lease(view["id"])
            except NotFound:
                return {**view, "state": "gone", "reason": "the service lost it"}
            except ServiceUnavailable as err:
                if on_unavailable is None:
                    raise
                on_unavailable(err)
                return view

        beats_here = keeper is not None and self.holder not in keeper.kept  # (a joined holder beats already)
        if beats_here:
            keeper.keep(self.holder)
        try:
            if read is not None:
                return await wait_in_queue(read, view or {}, patience=patience, on_round=on_round, poll=poll,
                                           beat=keeper and keeper.beat, beat_every=beat_every, **waiting)
            view = await wait_in_queue(read_lease, self.view or {}, patience=patience, on_round=on_round,
                                       poll=poll, beat=keeper and keeper.beat, beat_every=beat_every)
        finally:
            if beats_here:
                keeper.forget(self.holder)
        return self._took(view) if view.get("state") != "gone" else self._ended(view)

    def _ended(self, view: dict) -> dict:
        """The wait ended with the lease unknown to the service: this holder holds none."""
        self._took(None)
        return view

    # ------------------------------------------------------------ running
    def env(self, **options: Any) -> dict[str, str]:
        """The variables a process holding the granted slice gets (lease_env.slice_env; no GPU
        without one): `options` are slice_env's (service_url, gpu_memory_mib, mps, ...)."""
        return slice_env(self.view if self.granted else None, **options)

    def keepalive(self, keeper: Keepalive, *, on_ended: Callable[[str], Any] | None = None,
                  on_lost: Callable[[str], Any] | None = None, start: bool = True) -> None:
        """Join the process's one Keepalive: the holder is heartbeaten with every other holder the
        process keeps; `running` proves it alive (its end: `on_ended`). With `on_lost`, a lease that
        ended at the service (released from the sidebar, idle, a time limit) is told to it and the
        holder is heartbeaten no more; without, the holder is heartbeaten while it lives, so that an
        ended lease's slice stays out of the pool until it is gone. `start`: beat on the keeper's
        own interval (else a round of the caller beats it)."""
        self.keeper = keeper
        keeper.keep(self.holder, lease_id=(self.lease_id or None) if on_lost else None, running=self.running,
                    on_ended=on_ended, on_lost=on_lost)
        if start:
            keeper.start()

    def leave_keepalive(self) -> None:
        """No more heartbeats of this holder (the keeper goes on with the others)."""
        keeper, self.keeper = self.keeper, None
        if keeper is not None:
            keeper.forget(self.holder)

    async def report_activity(self, **activity: Any) -> dict:
        """A person's activity on the holder (last_activity, busy, connections): the core's idle rule reads it."""
        return self._took(await self.client.touch(self.lease_id, **activity))

    # ------------------------------------------------------------ ending
    async def release(self, *, gone: bool = False) -> dict | None:
        """End the lease (a queued one is withdrawn); the ended lease, or None when it had ended already.

        `gone` only once the holder is proven ended (its process exited, its server stopped): the
        slice then returns to the pool at once, also when the lease had already ended and its slice
        was waiting for the holder to go. Without it the slice returns when the service hears that
        the holder is gone, or when its heartbeats (stopped here) time out. A call that fails
        leaves the lease as it was, to be released again."""
        from .client import NotFound

        self.leave_keepalive()
        ended = None
        if self.lease_id:
            try:
                ended = await self.client.release(self.lease_id, holder_gone=gone)
            except NotFound:
                ended = None
        # a job keeps its holder across attempts (a requeued job has a new lease): only its own lease ends
        if gone and ended is None and kind_of(self.holder) != JOB:
            await self.gone()
        self._took(None)
        return ended

    async def gone(self) -> list[dict]:
        """Report the holder ended without naming a lease (a kernel's %gpu lease is unknown to its
        launcher): every lease it holds ends and every slice it kept returns."""
        self._took(None)
        return await self.client.holders_gone([self.holder])

    # ------------------------------------------------------------ restarts
    def get_state(self) -> dict:
        """What a client restarting later needs to find the lease again ({} when none)."""
        return {"lease_id": self.lease_id} if self.lease_id else {}

    def load_state(self, state: dict) -> None:
        self.lease_id = state.get("lease_id") or ""
        self.view = None
