"""Fan-out of the scheduler's events: server-sent event streams, long-poll waiters, the audit log.

Everything here runs on the IOLoop thread: the scheduler calls `EventBroker.publish` synchronously
after each stored state change, and the broker hands each event to whoever is waiting for it.
A stream gets its user's leases' events, and the fleet's (gpu.*, mig.*) only if it asked for them
(administrators' streams get every event, the fleet's unless they asked not to). Each event is
serialised once per view (`Published`), not once per stream: with dynamic MIG a fleet event comes
with most grants and releases, and a campus keeps thousands of streams open.

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
import logging
import re
import secrets
from collections import deque
from pathlib import Path
from typing import Any, Callable

import msgspec

from ..core.model import Event
from .auth import Identity
from .openapi import EVENT_ID_PATTERN

FLEET_EVENT_PREFIXES = ("gpu.", "mig.")
_LEASE_KEYS = ("lease_id", "lease")
STREAM_BACKLOG = 1000
REPLAY_SIZE = 10_000
EVENT_ID = re.compile(EVENT_ID_PATTERN)
RESET = "stream.reset"
# Answers and events as JSON: compact UTF-8, several times json.dumps's speed (the API's hottest serialiser)
JSON_ENCODER = msgspec.json.Encoder()


def parse_event_id(text: str) -> tuple[str, int] | None:
    """'3f9a0c21-17' -> ('3f9a0c21', 17); None if it is not an event id."""
    found = EVENT_ID.fullmatch(text)
    return (found.group(1), int(found.group(2))) if found else None


def is_fleet_event(event: Event) -> bool:
    """An event about the fleet (gpu.*, mig.*), of no user's lease."""
    return event.user is None and event.lease_id is None and event.type.startswith(FLEET_EVENT_PREFIXES)


def sse_message(event_id: str, data: dict[str, Any]) -> bytes:
    """One server-sent event: its id and its JSON (the id in it too), as the stream writes it."""
    data["id"] = event_id
    return b"id: %s\ndata: %s\n\n" % (event_id.encode(), JSON_ENCODER.encode(data))


class Published:
    """One event as the broker sent it: its id and its message in each view, each serialised once
    (when first needed) however many streams send it, replays included.

    The whole event is for administrators and for the user whose lease it is about; `public` is a
    fleet event as other users see it, without the lease ids it might carry.
    """

    __slots__ = ("seq", "event", "id", "_whole", "_public")

    def __init__(self, seq: int, event: Event, event_id: str):
        self.seq = seq
        self.event = event
        self.id = event_id
        self._whole: bytes | None = None
        self._public: bytes | None = None

    def whole(self) -> bytes:
        if self._whole is None:
            self._whole = sse_message(self.id, self.event.to_json())
        return self._whole

    def public(self) -> bytes:
        if self._public is None:
            data = self.event.to_json()
            data["data"] = {k: v for k, v in self.event.data.items() if k not in _LEASE_KEYS}
            self._public = sse_message(self.id, data)
        return self._public

    def serialised(self) -> int:
        """How many messages of this event were serialised (0 to 2)."""
        return (self._whole is not None) + (self._public is not None)

    def message_for(self, stream: "EventStream") -> bytes | None:
        """The message `stream` may see of this event, or None: administrators see every event (the
        fleet's only if their stream asked for them); a user, their own leases' events, and the fleet's
        without lease ids if their stream asked for them."""
        event = self.event
        if event.user is not None or event.lease_id is not None:
            return self.whole() if stream.identity.admin or event.user == stream.identity.user else None
        if event.type.startswith(FLEET_EVENT_PREFIXES):
            if not stream.fleet:
                return None
            return self.whole() if stream.identity.admin else self.public()
        return self.whole() if stream.identity.admin else None


class EventStream:
    """One subscriber's queue of the messages it may see; a subscriber that falls too far behind is closed.

    `fleet`: whether the fleet's events (gpu.*, mig.*) are sent too. `first` holds what is sent
    before the live events (a replay, or a `stream.reset`), unbounded: it was decided when the
    stream opened. `start` is the id the stream goes on after.
    """

    def __init__(self, identity: Identity, start: str, fleet: bool = False, backlog: int = STREAM_BACKLOG):
        self.identity = identity
        self.fleet = fleet
        self.start = start
        self.first: deque[bytes] = deque()
        self.queue: asyncio.Queue[bytes | str] = asyncio.Queue(maxsize=backlog)
        self.closed = False

    def offer(self, message: bytes) -> None:
        if self.closed:
            return
        try:
            self.queue.put_nowait(message)
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

    async def next(self, timeout: float) -> bytes | None:
        """The next message (`id:` and `data:`), or None on timeout; raises EOFError once the stream is closed."""
        if self.first:
            return self.first.popleft()
        try:
            item = await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if isinstance(item, str):
            raise EOFError(item)
        return item


_AUDIT_JSON = msgspec.json.Encoder(enc_hook=str)  # a value JSON has no type for is written as its str()


class AuditLog:
    """A JSON-lines file, one event per line, appended as events happen and flushed once per IOLoop
    turn (a group commit announces several events in one turn; at once outside a running loop)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self._flush_due = False

    def write(self, event: Event) -> None:
        self._file.write(_AUDIT_JSON.encode(event.to_json()).decode() + "\n")
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
    """Receives every scheduler event and passes it on to streams, waiters, listeners and the audit log.

    Streams are indexed by who may see what, so an event goes only to the streams that may send it:
    a lease's event to its user's streams and the administrators', a fleet event to the streams that
    asked for the fleet. `serialised` and `sent` count the messages made and queued (GET /metrics).
    """

    def __init__(self, audit_log: AuditLog | None = None, log: logging.Logger | None = None,
                 replay_size: int = REPLAY_SIZE):
        self.audit_log = audit_log
        self.log = log or logging.getLogger(__name__)
        self.streams: set[EventStream] = set()
        self._admin_streams: set[EventStream] = set()
        self._user_streams: dict[str, set[EventStream]] = {}
        self._fleet_streams: set[EventStream] = set()
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._listeners: list[Callable[[Event], None]] = []
        self.epoch = secrets.token_hex(4)
        self._seq = 0  # the number of the last event published
        self._kept: deque[Published] = deque(maxlen=replay_size)
        self.serialised = 0
        self.sent = 0

    @property
    def position(self) -> str:
        """The id of the last event published (`<epoch>-0` before the first)."""
        return f"{self.epoch}-{self._seq}"

    @property
    def _oldest_kept(self) -> int:
        """The number of the oldest event kept (the next one's when none is)."""
        return self._kept[0].seq if self._kept else self._seq + 1

    def add_listener(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def publish(self, event: Event) -> None:
        self._seq += 1
        published = Published(self._seq, event, f"{self.epoch}-{self._seq}")
        self._kept.append(published)
        if self.audit_log is not None:
            try:
                self.audit_log.write(event)
            except OSError as err:
                self.log.error("cannot write the audit log %s: %s", self.audit_log.path, err)
        for listener in self._listeners:
            listener(event)
        self._fan_out(published)
        if event.lease_id is not None and event.type != "lease.queued":
            for future in self._waiters.pop(event.lease_id, ()):
                if not future.done():
                    future.set_result(event)

    def _fan_out(self, published: Published) -> None:
        event = published.event
        if event.user is not None or event.lease_id is not None:
            streams = [*self._admin_streams, *self._user_streams.get(event.user, ())]
        elif is_fleet_event(event):
            streams = list(self._fleet_streams)
        else:
            streams = list(self._admin_streams)
        for stream in streams:
            message = published.message_for(stream)
            if message is not None:
                stream.offer(message)
                self.sent += 1
        self.serialised += published.serialised()

    def open_stream(self, identity: Identity, after: tuple[str, int] | None = None,
                    now: float = 0.0, fleet: bool | None = None) -> EventStream:
        """A stream of what `identity` may see from now on; with `after` (a parsed event id), first the
        events after it, or a `stream.reset` (at time `now`) saying why they cannot be replayed.
        `fleet`: whether it sends the fleet's events too; by default only administrators' streams do."""
        stream = EventStream(identity, self.position, fleet=identity.admin if fleet is None else fleet)
        if after is not None:
            why_not = self._why_not_replayable(*after)
            if why_not:
                stream.first.append(sse_message(self.position, {
                    "type": RESET, "time": now, "lease_id": None, "user": None,
                    "data": {"reason": why_not, "last_event_id": f"{after[0]}-{after[1]}"}}))
                self.serialised += 1
            else:
                stream.start = f"{after[0]}-{after[1]}"
                for published in itertools.islice(self._kept, after[1] - self._oldest_kept + 1, None):
                    made = published.serialised()
                    message = published.message_for(stream)
                    self.serialised += published.serialised() - made
                    if message is not None:
                        stream.first.append(message)
                        self.sent += 1
        self.streams.add(stream)
        if identity.admin:
            self._admin_streams.add(stream)
        else:
            self._user_streams.setdefault(identity.user, set()).add(stream)
        if stream.fleet:
            self._fleet_streams.add(stream)
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
        self._admin_streams.discard(stream)
        self._fleet_streams.discard(stream)
        users = self._user_streams.get(stream.identity.user)
        if users is not None:
            users.discard(stream)
            if not users:
                del self._user_streams[stream.identity.user]

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
