"""The errors the core raises for requests it refuses, and for changes the store did not take."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base of the errors the core raises for requests it refuses."""


class NotFound(SchedulerError):
    pass


class StoreFailed(SchedulerError):
    """The store did not take a change: the core undid all of it, devices included, and carries on."""


class QuotaExceeded(SchedulerError):
    def __init__(self, scope: str, key: str, limit: float, message: str):
        super().__init__(message)
        self.scope = scope
        self.key = key
        self.limit = limit
        self.limit_text = ""  # 'at most 20 GiB': what an offer the quota never allows shows


class HolderBusy(SchedulerError):
    """The holder already has an active lease."""

    def __init__(self, lease_id: str):
        super().__init__(f"this holder already has lease {lease_id}; release it first")
        self.lease_id = lease_id
