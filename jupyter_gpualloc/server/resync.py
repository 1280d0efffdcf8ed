"""What the server's event stream has told it about its user's leases and jobs, to catch up after a gap.

The server's stream from the service resumes after the last event it read, and the service
replays what came meanwhile. When it cannot (it restarted, or more events came than it keeps),
its first event is `stream.reset`; the server then reads its user's leases and jobs again, and
`StreamMirror.catch_up` compares them with what the stream told it (and what it read when it
first connected: the stream's position first, then the state, then the events after that
position, so none falls between), and makes the events its consumers missed: the idle monitor (which shuts a
kernel down when its lease was taken away), jupyter_events (the sidebar), the kernels' relay
(their notices). They are the events the service would have sent (REST API v1's event JSON, with
`"resync": true` and no `id`), built from the state, for what changed only:

- a lease that ended: `lease.<its state>` (expired, preempted, released, ...) with its reason;
  a lease the service no longer knows at all: `lease.expired`;
- a lease granted (or queued) that the stream never announced: `lease.granted` (`lease.queued`);
- a granted lease warned idle (`lease.idle_warning`, `idle_s` since its last reported activity,
  no `release_at`: the grace is the service's policy), or no longer (`lease.idle_cleared`);
- a deadline warned (`lease.deadline_warning`) or moved later (`lease.extended`);
- a granted lease's usage quota (the user's, read from GET /usage) that passed its warning level
  or its limit since the stream last told of it: `usage.warning` / `usage.exceeded`, with the
  quota's standing as its data, as the service sends each running lease once per level;
- a job whose state changed: `job.<state>`, `job.started` for running.

Reading the same state again makes nothing: a service that restarted and recovered every lease
unchanged causes no event at all.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..kernel.notices import USAGE_EVENTS, usage_event_type

RESET = "stream.reset"
ENDED = ("released", "expired", "preempted", "cancelled", "rejected")


def lease_view(lease: Mapping[str, Any]) -> dict[str, Any]:
    """What is compared of a lease (REST API v1 JSON)."""
    deadline = lease.get("deadline") or {}
    return {"state": lease["state"], "holder": lease["holder"], "idle_warned_at": lease.get("idle_warned_at"),
            "deadline": deadline.get("at"), "deadline_warned_at": deadline.get("warned_at"),
            "extensions": deadline.get("extensions")}


def job_event_type(state: str) -> str:
    return "job.started" if state == "running" else f"job.{state}"


class StreamMirror:
    """The leases (id -> lease_view), jobs (id -> state) and usage warnings ((lease, quota scope,
    quota who) -> event type) of the server's user, as its stream told them."""

    def __init__(self) -> None:
        self.leases: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, str] = {}
        self.usage: dict[tuple[str, str, str], str] = {}

    def load(self, leases: list[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]],
             quotas: Iterable[Mapping[str, Any]] = ()) -> None:
        """Start from the state read before the stream first opened (nothing is announced)."""
        self.leases = {l["id"]: lease_view(l) for l in leases}
        self.jobs = {j["id"]: j["state"] for j in jobs}
        self.usage = {}
        self._usage_changes(quotas, leases)

    def seen(self, event: Mapping[str, Any]) -> None:
        """Follow one event of the stream."""
        kind, data, lease_id = event.get("type") or "", event.get("data") or {}, event.get("lease_id")
        if kind.startswith("job.") and data.get("job_id"):
            self.jobs[data["job_id"]] = data.get("state", "")
            return
        if kind in USAGE_EVENTS and lease_id is not None:
            self.usage[(lease_id, data.get("scope", ""), data.get("who", ""))] = kind
            return
        if not kind.startswith("lease.") or lease_id is None:
            return
        state = data.get("state", "")
        if state in ENDED:
            self._forget(lease_id)
            return
        view = self.leases.setdefault(lease_id, {"state": state, "holder": data.get("holder", ""),
                                                 "idle_warned_at": None, "deadline": None,
                                                 "deadline_warned_at": None, "extensions": None})
        view["state"] = state or view["state"]
        if kind in ("lease.granted", "lease.idle_cleared"):
            view["idle_warned_at"] = None
        elif kind == "lease.idle_warning":
            view["idle_warned_at"] = event.get("time")
        elif kind == "lease.deadline_warning":
            view.update(deadline=data.get("deadline"), deadline_warned_at=event.get("time"))
        elif kind == "lease.extended":
            view.update(deadline=data.get("deadline"), extensions=data.get("extensions"), deadline_warned_at=None)

    def missing(self, leases: Iterable[Mapping[str, Any]]) -> list[str]:
        """The leases the stream told of that are not among these active ones (ended since)."""
        active = {l["id"] for l in leases}
        return [lease_id for lease_id in self.leases if lease_id not in active]

    def catch_up(self, leases: list[Mapping[str, Any]], ended: Mapping[str, Mapping[str, Any] | None],
                 jobs: list[Mapping[str, Any]], now: float,
                 quotas: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
        """The events that bring a reader of this mirror up to the state read, in order; the mirror follows.

        `leases`: the user's active leases; `ended`: each of `missing(leases)` as read again (None:
        the service does not know it); `jobs`: the user's jobs; `now`: the service's time (the reset's);
        `quotas`: the user's usage quotas (GET /usage).
        """
        made: list[dict[str, Any]] = []
        for lease_id in self.missing(leases):
            lease = ended.get(lease_id)
            view = self.leases[lease_id]
            self._forget(lease_id)
            if lease is not None and lease["state"] not in ENDED:
                continue  # active again only in a read made later than the list: the next reset tells
            state = lease["state"] if lease else "expired"
            reason = lease.get("reason", "") if lease else "the allocator no longer knows this lease"
            made.append(self._event(f"lease.{state}", (lease or {}).get("ended_at") or now, lease_id,
                                    lease or {"holder": view["holder"]}, state=state, reason=reason))
        for lease in leases:
            made.extend(self._changes(lease, self.leases.get(lease["id"]), now))
            self.leases[lease["id"]] = lease_view(lease)
        for lease, quota, kind in self._usage_changes(quotas, leases):
            made.append({"type": kind, "time": now, "lease_id": lease["id"], "user": lease.get("user"),
                         "resync": True, "data": {"holder": lease.get("holder", ""), "state": "granted", **quota}})
        for job in jobs:
            if self.jobs.get(job["id"]) != job["state"]:
                self.jobs[job["id"]] = job["state"]
                made.append({"type": job_event_type(job["state"]), "time": now, "lease_id": job.get("lease_id"),
                             "user": job.get("user"), "resync": True,
                             "data": {"job_id": job["id"], "name": job.get("name"), "state": job["state"],
                                      "attempt": job.get("attempts"), "priority": job.get("priority"),
                                      "reason": job.get("reason")}})
        return made

    def _changes(self, lease: Mapping[str, Any], old: Mapping[str, Any] | None, now: float) -> list[dict]:
        """The events between what was told of a lease (`old`, None: nothing) and the lease now."""
        made = []
        new = lease_view(lease)
        if old is None or old["state"] != new["state"]:
            if new["state"] == "queued":
                made.append(self._event("lease.queued", lease.get("created_at") or now, lease["id"], lease,
                                        position=lease.get("position")))
            else:
                made.append(self._event("lease.granted", lease.get("granted_at") or now, lease["id"], lease,
                                        slice=lease.get("slice")))
        if new["state"] != "granted":
            return made
        told = old or {}
        if new["idle_warned_at"] is not None and new["idle_warned_at"] != told.get("idle_warned_at"):
            active = max(lease.get("last_activity") or 0.0, lease.get("granted_at") or 0.0)
            made.append(self._event("lease.idle_warning", new["idle_warned_at"], lease["id"], lease,
                                    idle_s=max(0.0, new["idle_warned_at"] - active)))
        elif new["idle_warned_at"] is None and told.get("idle_warned_at") is not None:
            made.append(self._event("lease.idle_cleared", now, lease["id"], lease))
        deadline = lease.get("deadline") or {}
        if (new["extensions"] or 0) > (told.get("extensions") or 0):  # a granted event tells of none yet
            made.append(self._event("lease.extended", now, lease["id"], lease, deadline=new["deadline"],
                                    extensions=new["extensions"], extensions_left=deadline.get("extensions_left")))
        if new["deadline_warned_at"] is not None and new["deadline_warned_at"] != told.get("deadline_warned_at"):
            made.append(self._event("lease.deadline_warning", new["deadline_warned_at"], lease["id"], lease,
                                    deadline=new["deadline"], release_at=new["deadline"],
                                    extensions_left=deadline.get("extensions_left")))
        return made

    def _usage_changes(self, quotas: Iterable[Mapping[str, Any]],
                       leases: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping, Mapping, str]]:
        """(lease, quota, event type) for each granted lease whose quota stands at a level not yet
        told of; the mirror takes the quotas' levels."""
        quotas = list(quotas)
        changes = []
        for lease in leases:
            if lease["state"] != "granted":
                continue
            for quota in quotas:
                key, kind = (lease["id"], quota["scope"], quota["who"]), usage_event_type(quota)
                if kind is None:
                    self.usage.pop(key, None)
                elif self.usage.get(key) != kind:
                    self.usage[key] = kind
                    changes.append((lease, quota, kind))
        return changes

    def _forget(self, lease_id: str) -> None:
        """A lease ended: nothing more is told of it."""
        self.leases.pop(lease_id, None)
        self.usage = {key: kind for key, kind in self.usage.items() if key[0] != lease_id}

    @staticmethod
    def _event(kind: str, time: float, lease_id: str, lease: Mapping[str, Any], **data: Any) -> dict[str, Any]:
        state = data.pop("state", lease.get("state"))
        return {"type": kind, "time": time, "lease_id": lease_id, "user": lease.get("user"), "resync": True,
                "data": {"holder": lease.get("holder", ""), "state": state, **data}}
