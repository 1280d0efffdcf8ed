"""GET /usage: GPU-hours reports from the core's usage ledger, as JSON or CSV.

A user gets their own usage and where they stand against their usage quotas; an admin gets
everyone's (or one user's with `user=`).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

from ..core.usage import RECENT_SAMPLE_SECONDS, REPORT_DIMENSIONS, to_csv
from .handlers import ApiError, ApiHandler

HISTORY_DAYS = 14  # the days GET /usage/history covers by default


def parse_moment(text: str) -> float | None:
    """Epoch seconds, a date or an ISO-8601 time (UTC unless it says otherwise); None if it is none."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
        except ValueError:
            return None
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    return value if math.isfinite(value) and value >= 0 else None


def month_start(now: float) -> float:
    """00:00 UTC on the first day of now's month: the default start of a report."""
    day = datetime.fromtimestamp(now, timezone.utc)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def day_start(now: float) -> float:
    """00:00 UTC of now's day."""
    return now - now % 86400


class _UsageQuery(ApiHandler):
    """Query arguments shared by the usage reports: the period and whose usage."""

    arguments = {"since", "until", "user"}

    def period_and_user(self, now: float, default_since: float | None = None) -> tuple[float, float, str | None]:
        """(since, until, user); since defaults to `default_since`, else the start of this month."""
        for name in self.request.query_arguments:
            if name not in self.arguments:
                raise ApiError(400, f"unknown query argument {name!r} (use {', '.join(sorted(self.arguments))})",
                               field=name)
        since = self._time("since")
        if since is None:
            since = month_start(now) if default_since is None else default_since
        until = self._time("until")
        until = now if until is None else until
        if until <= since:
            raise ApiError(400, "until must be later than since", field="until")
        user = self.get_query_argument("user", None)
        if not self.identity.admin:
            if user not in (None, self.identity.user):
                raise ApiError(403, "only the allocator's admins see other users' usage", field="user")
            user = self.identity.user
        return since, until, user

    def _time(self, name: str) -> float | None:
        text = self.get_query_argument(name, None)
        if text is None:
            return None
        moment = parse_moment(text)
        if moment is None:
            raise ApiError(400, f"{name} must be a date (2026-11-01), an ISO-8601 time or epoch seconds",
                           field=name)
        return moment


class UsageHandler(_UsageQuery):
    arguments = {"since", "until", "by", "user"}

    def get(self) -> None:
        now = self.ctx.clock()
        since, until, user = self.period_and_user(now)
        by = self.get_query_argument("by", "user")
        if by not in REPORT_DIMENSIONS:
            raise ApiError(400, f"by must be one of {', '.join(REPORT_DIMENSIONS)}", field="by")
        usage = self.ctx.usage
        names = self.scheduler.reservations.lease_names() if by == "reservation" else None
        rows = usage.report(since, until, by, now, user=user, reservation_of=names)
        if "text/csv" in self.request.headers.get("Accept", ""):
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.finish(to_csv(rows, by))
            return
        per_user = rows if by == "user" else usage.report(since, until, "user", now, user=user)
        totals = {"gpu_hours": round(sum(r["gpu_hours"] for r in per_user), 6),
                  "gib_hours": round(sum(r["gib_hours"] for r in per_user), 6)}
        self.write_json({
            "since": since, "until": min(until, now), "by": by, "user": user, "rows": rows, "total": totals,
            "quotas": [q.to_json() for q in usage.quotas_for(self.identity.user, self.identity.groups, now)],
        })


class EfficiencyHandler(_UsageQuery):
    """GET /usage/efficiency: leases with GPU utilisation samples, GPU-hours held vs. busy, least efficient first."""

    def get(self) -> None:
        now = self.ctx.clock()
        since, until, user = self.period_and_user(now)
        rows = self.ctx.usage.efficiency(since, until, now, user=user)
        self.write_json({"since": since, "until": min(until, now), "user": user, "rows": rows})


class HistoryHandler(_UsageQuery):
    """GET /usage/history: GPU-hours per day, split by offer (default: the last HISTORY_DAYS days, today's included)."""

    def get(self) -> None:
        now = self.ctx.clock()
        since, until, user = self.period_and_user(now, default_since=day_start(now) - (HISTORY_DAYS - 1) * 86400)
        days = self.ctx.usage.history(since, until, now, user=user)
        self.write_json({"since": since, "until": min(until, now), "user": user, "days": days})


class UtilizationHandler(ApiHandler):
    """POST /leases/<id>/utilization: a GPU utilisation sample of a lease (its holder's watchdog, or an admin);
    GET: its samples of the last minutes (its owner's, or an admin's)."""

    def get(self, lease_id: str) -> None:
        lease = self.visible_lease(lease_id)
        now = self.ctx.clock()
        samples = self.ctx.usage.recent_samples(lease.id, now)
        self.write_json({"lease_id": lease.id, "window": RECENT_SAMPLE_SECONDS, "now": now,
                         "samples": [{"at": at, "sm_percent": value} for at, value in samples]})

    def post(self, lease_id: str) -> None:
        body = self.json_body()
        unknown = set(body) - {"sm_percent"}
        if unknown:
            raise ApiError(400, f"unknown field {sorted(unknown)[0]!r}", field=sorted(unknown)[0])
        value = body.get("sm_percent")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
            raise ApiError(400, "sm_percent must be a number from 0 to 100", field="sm_percent")
        lease = self.visible_lease(lease_id)
        lease = self.scheduler.sample_gpu(lease.id, now=self.ctx.clock(), sm_percent=float(value))
        self.write_json(self.lease_json(lease))
