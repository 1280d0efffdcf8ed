"""Fan-out of the scheduler's events: server-sent event streams, long-poll waiters, the audit log.

Everything here runs on the IOLoop thread: the scheduler calls `EventBroker.publish` synchronously
after each stored state change, and the broker hands each event to whoever is waiting for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Callable

from ..core.model import Event
from .auth import Identity

FLEET_EVENT_PREFIXES = ("gpu.", "mig.")
_LEASE_KEYS = ("lease_id", "lease")
STREAM_BACKLOG = 1000


def visible_event(event: Event, identity: Identity) -> dict[str, Any] | None:
    """The event as `identity` may see it: their own leases' events and the fleet's, or None.

    Administrators see everything. Fleet events (gpu.*, mig.*) are shown to every user without
    the lease ids they might carry.
    """
    data = event.to_json()
    if identity.admin:
        return data
    if event.user is not None or event.lease_id is not None:
        return data if event.user == identity.user else None
    if not event.type.startswith(FLEET_EVENT_PREFIXES):
        return None
    data["data"] = {k: v for k, v in event.data.items() if k not in _LEASE_KEYS}
    return data


class EventStream:
    """One subscriber's queue of visible events; a subscriber that falls too far behind is closed."""

    def __init__(self, identity: Identity, backlog: int = STREAM_BACKLOG):
        self.identity = identity
        self.queue: asyncio.Queue[dict[str, Any] | str] = asyncio.Queue(maxsize=backlog)
        self.closed = False

    def offer(self, event: Event) -> None:
        if self.closed:
            return
        data = visible_event(event, self.identity)
        if data is None:
            return
        try:
            self.queue.put_nowait(data)
        except asyncio.QueueFull:
            self.close("too many events not read: the stream was closed")

    def close(self, reason: str) -> None:
        """End the stream: the reader's next() raises EOFError(reason) once it gets there."""
        if self.closed:
            return
        self.closed = True
        if self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(reason)

    async def next(self, timeout: float) -> dict[str, Any] | None:
        """The next event, or None on timeout; raises EOFError once the stream is closed."""
        try:
            item = await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if isinstance(item, str):
            raise EOFError(item)
        return item


class AuditLog:
    """A JSON-lines file, one event per line, appended and flushed as events happen."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, event: Event) -> None:
        self._file.write(json.dumps(event.to_json(), separators=(",", ":"), default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EventBroker:
    """Receives every scheduler event and passes it on to streams, waiters, listeners and the audit log."""

    def __init__(self, audit_log: AuditLog | None = None, log: logging.Logger | None = None):
        self.audit_log = audit_log
        self.log = log or logging.getLogger(__name__)
        self.streams: set[EventStream] = set()
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._listeners: list[Callable[[Event], None]] = []

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def publish(self, event: Event) -> None:
        if self.audit_log is not None:
            try:
                self.audit_log.write(event)
            except OSError as err:
                self.log.error("cannot write the audit log %s: %s", self.audit_log.path, err)
        for listener in self._listeners:
            listener(event)
        for stream in list(self.streams):
            stream.offer(event)
        if event.lease_id is not None and event.type != "lease.queued":
            for future in self._waiters.pop(event.lease_id, ()):
                if not future.done():
                    future.set_result(event)

    def open_stream(self, identity: Identity) -> EventStream:
        stream = EventStream(identity)
        self.streams.add(stream)
        return stream

    def close_stream(self, stream: EventStream, reason: str = "closed") -> None:
        stream.close(reason)
        self.streams.discard(stream)

    async def wait_for_change(self, lease_id: str, timeout: float) -> Event | None:
        """The next event of a lease other than `lease.queued` (granted, ended...), or None on timeout."""
        future = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(lease_id, []).append(future)
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            waiting = self._waiters.get(lease_id)
            if waiting is not None and future in waiting:
                waiting.remove(future)
                if not waiting:
                    del self._waiters[lease_id]

    def close(self) -> None:
        for stream in list(self.streams):
            self.close_stream(stream, "the service is shutting down")
        if self.audit_log is not None:
            self.audit_log.close()
