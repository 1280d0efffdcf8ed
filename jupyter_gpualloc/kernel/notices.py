"""One line in the notebook when the service warns about, or ends, the lease this kernel holds.

While the kernel holds a lease, `LeaseNotices` follows the service's event stream (GET /events,
the caller's own events only; in a server with the extension in remote mode, the server's relay of
its own stream, $GPUALLOC_EVENTS_URL) on the client's thread and prints one line to stderr for the
events of that lease that its user must act on: a deadline or idle warning, a usage quota nearly
or wholly used up, and the lease ending without being released by its holder. In a kernel the
line shows under the cell that ran last. A stream that ends (the service or the server
restarted, the network dropped) is opened again after `retry` seconds; what the lease went through
meanwhile is then read from the lease itself (`read_lease`, from the service) and from the user's
usage quotas (`read_quotas`): an end, an idle or a deadline warning, or a quota's warning the
stream did not deliver is told once, as its event would have been.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from typing import Any, Callable, Iterable, Mapping

from .extend import extensions_text, moment_text
from .sizes import format_duration
from .status import end_text

RETRY_SECONDS = 5.0
TOLD_OF_ENDS = ("expired", "preempted")  # the ends of a lease not released by its holder
USAGE_EVENTS = ("usage.warning", "usage.exceeded")


def usage_event_type(quota: Mapping[str, Any]) -> str | None:
    """The usage event the service sends each running lease a quota (UsageQuota JSON) counts against
    at the quota's standing, or None while it stands ok."""
    standing = quota.get("standing", "ok")
    return None if standing == "ok" else f"usage.{standing}"


def told_key(event: Mapping[str, Any]) -> tuple:
    """What makes two notices the same: a quota's warning or end once per lease, quota and level (as
    the service sends them, and whatever time a catch-up gives it); any other event once per time."""
    kind, data = event.get("type"), event.get("data") or {}
    if kind in USAGE_EVENTS:
        return event.get("lease_id"), kind, data.get("scope"), data.get("who")
    return event.get("lease_id"), kind, event.get("time")


def missed_events(lease: Mapping[str, Any], quotas: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The events a lease's state, and the state of its user's usage `quotas`, say it went through
    that notice_line speaks of (ends and warnings), as the service would have sent them, with the
    times the state keeps (a quota's warning: none)."""
    lease_id, state = lease["id"], lease.get("state")
    if state in TOLD_OF_ENDS:
        return [{"type": f"lease.{state}", "time": lease.get("ended_at"), "lease_id": lease_id,
                 "data": {"reason": lease.get("reason", "")}}]
    if state != "granted":
        return []
    made = []
    if lease.get("idle_warned_at") is not None:
        release = lease.get("idle_release") or {}
        made.append({"type": "lease.idle_warning", "time": lease["idle_warned_at"], "lease_id": lease_id,
                     "data": {"release_at": release["release_at"]} if "release_at" in release else {}})
    deadline = lease.get("deadline") or {}
    if deadline.get("warned_at") is not None:
        made.append({"type": "lease.deadline_warning", "time": deadline["warned_at"], "lease_id": lease_id,
                     "data": {"deadline": deadline["at"], "extensions_left": deadline.get("extensions_left", 0)}})
    for quota in quotas:
        kind = usage_event_type(quota)
        if kind is not None:
            made.append({"type": kind, "time": None, "lease_id": lease_id, "data": dict(quota)})
    return made


def notice_line(event: Mapping[str, Any]) -> str | None:
    """The line for one event of a lease, or None for events that need no word to the user."""
    kind, data, lease_id = event.get("type"), event.get("data") or {}, event.get("lease_id")
    if kind == "lease.deadline_warning":
        left = data.get("extensions_left", 0)
        advice = f"{extensions_text(left)}: %gpu extend moves it later" if left else \
            "it cannot be extended: save your work"
        when = moment_text(data["deadline"], event["time"])
        return f"gpu: lease {lease_id} reaches its time limit at {when}; {advice}"
    if kind == "lease.idle_warning":
        when = f"in {format_duration(data['release_at'] - event['time'])}" if data.get("release_at") else "soon"
        return f"gpu: lease {lease_id} is idle: it is released {when} unless this kernel is used"
    if kind == "usage.warning":
        return f"gpu: usage quota nearly used up: {data.get('message', '')}"
    if kind == "usage.exceeded":
        return f"gpu: usage quota used up: {data.get('message', '')}"
    end = (kind or "").removeprefix("lease.")
    if end in TOLD_OF_ENDS:
        return f"gpu: lease {lease_id} {end_text(end, data.get('reason'))}"
    return None


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class LeaseNotices:
    """Prints `notice_line` for the events of the lease `lease_id()` names, while started."""

    def __init__(self, client: Callable[[], Any], lease_id: Callable[[], str | None], *,
                 read_lease: Callable[[str], Mapping[str, Any]] | None = None,
                 read_quotas: Callable[[], Iterable[Mapping[str, Any]]] | None = None,
                 show: Callable[[str], None] = say, retry: float = RETRY_SECONDS):
        self.client = client
        self.lease_id = lease_id
        self.read_lease = read_lease
        self.read_quotas = read_quotas
        self.show = show
        self.retry = retry
        self._told: set[tuple] = set()  # told_key of each line shown: none is shown twice
        self._stop: threading.Event | None = None
        self._stream: concurrent.futures.Future | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._stop is not None

    def start(self) -> None:
        with self._lock:
            if self._stop is not None:
                return
            stop = self._stop = threading.Event()
        threading.Thread(target=self._run, args=(stop,), name="gpualloc-notices", daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            stop, stream = self._stop, self._stream
            self._stop = self._stream = None
            if stop is not None:
                stop.set()
        if stream is not None:
            stream.cancel()

    def _run(self, stop: threading.Event) -> None:
        caught_up = True  # nothing was missed before the first stream
        while not stop.is_set():
            stream = None
            try:
                stream = self.client().watch_events(self._on_event)
                with self._lock:
                    if stop.is_set():
                        stream.cancel()
                    else:
                        self._stream = stream
                if not caught_up:  # read once the stream is asked for, so what comes after the read is streamed
                    self._catch_up()
                    caught_up = True
                stream.result()
            except (Exception, concurrent.futures.CancelledError):  # down, restarting, or stopped
                if stream is not None:
                    stream.cancel()
            caught_up = False
            stop.wait(self.retry)

    def _catch_up(self) -> None:
        """After the stream was down: tell what the lease's state says the stream did not."""
        lease_id = self.lease_id()
        if self.read_lease is None or lease_id is None:
            return
        lease = self.read_lease(lease_id)
        quotas = []
        if self.read_quotas is not None and lease.get("state") == "granted":
            try:
                quotas = list(self.read_quotas())
            except Exception:  # the lease's own notices go on; the quotas' wait for the next catch-up
                quotas = []
        with self._lock:  # a quota back under its warning level is warned again when it passes it again
            for quota in quotas:
                if usage_event_type(quota) is None:
                    self._told -= {told_key({"type": kind, "lease_id": lease_id, "data": quota})
                                   for kind in USAGE_EVENTS}
        for event in missed_events(lease, quotas):
            self._on_event(event)

    def _on_event(self, event: Mapping[str, Any]) -> None:
        if event.get("lease_id") is None or event.get("lease_id") != self.lease_id():
            return
        line = notice_line(event)
        told = told_key(event)
        with self._lock:
            if line is None or told in self._told:
                return
            self._told.add(told)
        self.show(line)
