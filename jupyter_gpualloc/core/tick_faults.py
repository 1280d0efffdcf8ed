"""The rules of the scheduler's tick that raise: each undone alone, logged once while it fails, and counted.

Scheduler.tick runs each of its rules (dead holders, idle release, usage quotas, time limits,
each reservation's window, the scheduling pass) as a part of the tick's change
(SchedulerJournal.part): one that raises is put back alone and the others go on. A rule that
fails is logged with its traceback the first time, then counted without a word until it works
again (logged too) or no longer runs (its reservation was deleted). The service shows the
broken rules on /health and counts every failure in the metric gpualloc_tick_errors_total.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class Broken:
    """A rule failing since `since`: its kind ('reservation' for each reservation's window) and last error."""

    rule: str
    kind: str
    error: str
    since: float
    failures: int = 1

    def to_json(self) -> dict:
        return {"rule": self.rule, "kind": self.kind, "error": self.error, "since": self.since,
                "failures": self.failures}


class TickFaults:
    """Which rules of the tick fail now, and how often each has failed since the start."""

    def __init__(self) -> None:
        self.broken: dict[str, Broken] = {}
        self.failures: dict[str, int] = {}
        self._ran: set[str] = set()

    def begin(self) -> None:
        """A tick starts: the rules it runs are noted."""
        self._ran = set()

    def failed(self, rule: str, kind: str, err: Exception, now: float) -> None:
        """The rule raised (its part of the tick was undone): logged the first time only."""
        self._ran.add(rule)
        self.failures[rule] = self.failures.get(rule, 0) + 1
        error = f"{type(err).__name__}: {err}"
        broken = self.broken.get(rule)
        if broken is not None:
            broken.failures += 1
            broken.error = error
            return
        self.broken[rule] = Broken(rule, kind, error, now)
        log.error("the scheduler's rule '%s' failed and is skipped until it works again; the other rules go on",
                  rule, exc_info=err)

    def worked(self, rule: str) -> None:
        self._ran.add(rule)
        broken = self.broken.pop(rule, None)
        if broken is not None:
            log.warning("the scheduler's rule '%s' works again after %d failed ticks", rule, broken.failures)

    def end(self) -> None:
        """A tick ended: a broken rule it no longer runs (a deleted reservation's) is broken no more."""
        for rule in [r for r in self.broken if r not in self._ran]:
            del self.broken[rule]
            log.warning("the scheduler's rule '%s' no longer runs", rule)
