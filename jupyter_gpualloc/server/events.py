"""The extension's events through jupyter_events: registered schemas, emission, and the relay of lease events.

Each event type (`lease.granted`, `lease.idle_warning`, `watchdog.over_cap`, ...) has its own
schema in `schemas/`; the events are visible on jupyter_server's `/api/events/subscribe` and
on the sidebar's `/gpualloc/api/events` stream.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from jupyter_events import EventLogger

from ..core.holders import SERVER, kernel_of, parse_holder

SCHEMA_DIR = Path(__file__).with_name("schemas")
SCHEMA_PREFIX = "https://events.jupyter.org/jupyter_gpualloc/"

LEASE_EVENTS = ("lease.granted", "lease.queued", "lease.idle_warning", "lease.idle_cleared", "lease.released",
                "lease.expired", "lease.preempted", "lease.cancelled", "lease.rejected", "lease.deadline_warning",
                "lease.extended", "usage.warning", "usage.exceeded")
# what else each lease event carries on to the sidebar, so that it need not fetch the lease again
LEASE_FIELDS = {
    "lease.queued": ("position",),
    "lease.idle_warning": ("release_at",),
    "lease.deadline_warning": ("release_at", "deadline", "extensions_left"),
    "lease.extended": ("deadline", "extensions", "extensions_left"),
}
EVENT_TYPES = LEASE_EVENTS + ("kernel.gpu_shutdown", "watchdog.over_cap", "watchdog.unleased_gpu",
                              "watchdog.action")


def schema_id(event_type: str) -> str:
    """'lease.granted' -> 'https://events.jupyter.org/jupyter_gpualloc/lease/granted/v1'."""
    return f"{SCHEMA_PREFIX}{event_type.replace('.', '/')}/v1"


def event_type_of(schema: str) -> str:
    """The inverse of schema_id."""
    return schema[len(SCHEMA_PREFIX):].rsplit("/", 1)[0].replace("/", ".")


def register_schemas(logger: EventLogger) -> None:
    """Register every schema of the extension (idempotent)."""
    for event_type in EVENT_TYPES:
        if schema_id(event_type) not in logger.schemas:
            logger.register_event_schema(SCHEMA_DIR / f"{event_type.replace('.', '_')}.yaml")


def _utc(t: Any) -> str:
    return datetime.fromtimestamp(float(t or 0), timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def holder_words(holder: str) -> str:
    """Who holds a lease, as this server's user reads it: 'kernel <id>' (the sidebar names the
    notebook instead), 'this server', 'server <name>', 'job <id>'."""
    parsed = parse_holder(holder)
    if parsed is None:
        return holder
    if parsed.kind == SERVER:
        return f"server {parsed.name}" if parsed.name else "this server"
    return f"{parsed.kind} {parsed.name}"


# The words of the events that end a lease or its request, after "The GPU slice of <who>".
ENDS = {"lease.released": "was released", "lease.expired": "expired", "lease.preempted": "was taken back (preempted)"}
REQUEST_ENDS = {"lease.cancelled": "was withdrawn", "lease.rejected": "was refused"}


def lease_message(event_type: str, holder: str, data: Mapping[str, Any]) -> str:
    """One sentence about a lease event, for the sidebar and the notebook."""
    who = holder_words(holder)
    reason = data.get("reason")
    if event_type == "lease.idle_warning":
        return (f"The GPU slice of {who} has been idle for {data.get('idle_s', 0):.0f} s; it will be released "
                f"(and the kernel shut down) unless it is used again.")
    if event_type == "lease.deadline_warning":
        return (f"The GPU slice of {who} reaches its time limit at {_utc(data.get('release_at'))}; "
                f"it will be released then unless extended (%gpu extend).")
    if event_type == "lease.extended":
        return f"The GPU slice of {who} was extended until {_utc(data.get('deadline'))}."
    if event_type.startswith("usage."):
        return f"GPU usage of {who}: {data.get('message', '')}."
    if event_type == "lease.granted":
        devices = (data.get("slice") or {}).get("visible_devices", "")
        return f"{who[0].upper()}{who[1:]} got its GPU slice ({devices})."
    if event_type == "lease.queued":
        position = f" at position {data['position']}" if data.get("position") else ""
        return f"The GPU request of {who} is queued{position}" + (f": {reason}." if reason else ".")
    if event_type == "lease.idle_cleared":
        return f"The GPU slice of {who} is in use again: its idle warning is cleared."
    if event_type in REQUEST_ENDS:
        return f"The GPU request of {who} {REQUEST_ENDS[event_type]}" + (f": {reason}." if reason else ".")
    end = event_type.removeprefix("lease.")
    verb = ENDS.get(event_type, f"ended ({end})")
    if reason and verb.startswith("was ") and reason.startswith(f"{end} "):
        return f"The GPU slice of {who} was {reason}."  # not "was released: released by alice"
    return f"The GPU slice of {who} {verb}" + (f": {reason}." if reason else ".")


class GpuAllocEvents:
    """Emits the extension's events on the server's EventLogger."""

    def __init__(self, logger: EventLogger):
        self.logger = logger
        register_schemas(logger)

    def emit(self, event_type: str, **data: Any) -> None:
        """Emit one event; None values are left out."""
        self.logger.emit(schema_id=schema_id(event_type), data={k: v for k, v in data.items() if v is not None})

    def relay_lease_event(self, event: Mapping[str, Any]) -> None:
        """Re-emit a scheduler event (REST API v1 / core Event JSON) if it is a lease event."""
        if event.get("type") not in LEASE_EVENTS or not event.get("lease_id"):
            return
        data = dict(event.get("data") or {})
        holder = str(data.get("holder", ""))
        self.emit(event["type"], lease_id=event["lease_id"], holder=holder, kernel_id=kernel_of(holder),
                  state=data.get("state"), reason=data.get("reason"), slice=data.get("slice"),
                  **{name: data.get(name) for name in LEASE_FIELDS.get(event["type"], ())},
                  message=lease_message(event["type"], holder, data))

    def add_listener(self, listener: Callable[[str, dict], Any]) -> Callable[[], None]:
        """Call `listener(event_type, data)` (async) for every event of the extension; returns a remover."""

        async def forward(logger: EventLogger, schema_id: str, data: dict) -> None:
            await listener(event_type_of(schema_id), data)

        for event_type in EVENT_TYPES:
            self.logger.add_listener(schema_id=schema_id(event_type), listener=forward)

        def remove() -> None:
            for event_type in EVENT_TYPES:
                self.logger.remove_listener(schema_id=schema_id(event_type), listener=forward)

        return remove
