"""Fan-out of the scheduler's events: server-sent event streams, long-poll waiters, the audit log.

Everything here runs on the IOLoop thread: the scheduler calls `EventBroker.publish` synchronously
after each stored state change, and the broker hands each event to whoever is waiting for it.

Each event gets an id, `<epoch>-<n>`: `epoch` is drawn when the broker is made (a restarted
service has another), `n` counts this broker's events from 1. The broker keeps the last
`replay_size` events, so a stream opened after a given id first replays, for its caller's
visibility, every event after it, then goes on live with nothing lost or repeated between the
two (both happen on this thread, with no await between). When it cannot (another epoch, or the
events after the id are no longer kept), the stream's first event is `stream.reset`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
import secrets
from collections import deque
from pathlib import Path
from typing import Any, Callable

from ..core.model import Event
from .auth import Identity
from .openapi import EVENT_ID_PATTERN

FLEET_EVENT_PREFIXES = ("gpu.", "mig.")
_LEASE_KEYS = ("lease_id", "lease")
STREAM_BACKLOG = 1000
REPLAY_SIZE = 10_000
EVENT_ID = re.compile(EVENT_ID_PATTERN)
RESET = "stream.reset"


def parse_event_id(text: str) -> tuple[str, int] | None:
    """'3f9a0c21-17' -> ('3f9a0c21', 17); None if it is not an event id."""
    found = EVENT_ID.fullmatch(text)
    return (found.group(1), int(found.group(2))) if found else None


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
    """One subscriber's queue of visible events; a subscriber that falls too far behind is closed.

    `first` holds what is sent before the live events (a replay, or a `stream.reset`), unbounded:
    it was decided when the stream opened. `start` is the id the stream goes on after.
    """

    def __init__(self, identity: Identity, start: str, backlog: int = STREAM_BACKLOG):
        self.identity = identity
        self.start = start
        self.first: deque[dict[str, Any]] = deque()
        self.queue: asyncio.Queue[dict[str, Any] | str] = asyncio.Queue(maxsize=backlog)
        self.closed = False

    def offer(self, event: Event, event_id: str) -> None:
        if self.closed:
            return
        data = visible_event(event, self.identity)
        if data is None:
            return
        data["id"] = event_id
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
        if self.first:
            return self.first.popleft()
        try:
            item = await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if isinstance(item, str):
            raise EOFError(item)
        return item


_AUDIT_JSON = json.JSONEncoder(separators=(",", ":"), default=str)  # json.dumps makes one per call with these


class AuditLog:
    """A JSON-lines file, one event per line, appended as events happen and flushed once per IOLoop
    turn (a group commit announces several events in one turn; at once outside a running loop)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._flush_due = False

    def write(self, event: Event) -> None:
        self._file.write(_AUDIT_JSON.encode(event.to_json()) + "\n")
        if self._flush_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._file.flush()
            return
        self._flush_due = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_due = False
        try:
            if not self._file.closed:
                self._file.flush()
        except OSError as err:
            logging.getLogger(__name__).error("cannot write the audit log %s: %s", self.path, err)

    def close(self) -> None:
        self._file.close()


class EventBroker:
    """Receives every scheduler event and passes it on to streams, waiters, listeners and the audit log."""

    def __init__(self, audit_log: AuditLog | None = None, log: logging.Logger | None = None,
                 replay_size: int = REPLAY_SIZE):
        self.audit_log = audit_log
        self.log = log or logging.getLogger(__name__)
        self.streams: set[EventStream] = set()
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._listeners: list[Callable[[Event], None]] = []
        self.epoch = secrets.token_hex(4)
        self._seq = 0  # the number of the last event published
        self._kept: deque[tuple[int, Event]] = deque(maxlen=replay_size)

    @property
    def position(self) -> str:
        """The id of the last event published (`<epoch>-0` before the first)."""
        return f"{self.epoch}-{self._seq}"

    @property
    def _oldest_kept(self) -> int:
        """The number of the oldest event kept (the next one's when none is)."""
        return self._kept[0][0] if self._kept else self._seq + 1

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def publish(self, event: Event) -> None:
        self._seq += 1
        self._kept.append((self._seq, event))
        event_id = f"{self.epoch}-{self._seq}"
        if self.audit_log is not None:
            try:
                self.audit_log.write(event)
            except OSError as err:
                self.log.error("cannot write the audit log %s: %s", self.audit_log.path, err)
        for listener in self._listeners:
            listener(event)
        for stream in list(self.streams):
            stream.offer(event, event_id)
        if event.lease_id is not None and event.type != "lease.queued":
            for future in self._waiters.pop(event.lease_id, ()):
                if not future.done():
                    future.set_result(event)

    def open_stream(self, identity: Identity, after: tuple[str, int] | None = None,
                    now: float = 0.0) -> EventStream:
        """A stream of what `identity` may see from now on; with `after` (a parsed event id), first the
        events after it, or a `stream.reset` (at time `now`) saying why they cannot be replayed."""
        stream = EventStream(identity, self.position)
        if after is not None:
            why_not = self._why_not_replayable(*after)
            if why_not:
                stream.first.append({"type": RESET, "time": now, "lease_id": None, "user": None, "id": self.position,
                                     "data": {"reason": why_not, "last_event_id": f"{after[0]}-{after[1]}"}})
            else:
                stream.start = f"{after[0]}-{after[1]}"
                for seq, event in itertools.islice(self._kept, after[1] - self._oldest_kept + 1, None):
                    data = visible_event(event, identity)
                    if data is not None:
                        data["id"] = f"{self.epoch}-{seq}"
                        stream.first.append(data)
        self.streams.add(stream)
        return stream

    def _why_not_replayable(self, epoch: str, seq: int) -> str:
        """Why the events after event `seq` of `epoch` cannot be replayed; empty if they can."""
        if epoch != self.epoch:
            return "the service restarted: the events of its previous run are not kept"
        if seq > self._seq:
            return f"the service has sent no event {epoch}-{seq} yet"
        if seq < self._oldest_kept - 1:
            return (f"the events after {epoch}-{seq} are no longer kept "
                    f"(the service keeps its last {self._kept.maxlen})")
        return ""

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
