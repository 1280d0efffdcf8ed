"""The tick's heartbeat and idle rules read only the leases whose moment has come (LeaseMoments),
and act exactly as a walk over every active lease would: the same events, in the same order, at
the same times."""

from __future__ import annotations

import math
import random

import pytest

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.errors import SchedulerError, StoreFailed
from jupyter_gpualloc.core.lease_moments import LeaseMoments
from jupyter_gpualloc.core.model import Lease, LeaseState, PriorityClass, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler

from .conftest import fleet
from .test_store_failures import FlakyStore

RULED = ("lease.expired", "lease.idle_warning")  # what the two rules announce (nothing else expires here)
SPECS = [SliceSpec.from_json({"kind": "shared", "memory_gib": g}) for g in (2, 4, 8)]


def idle_since(s: Scheduler, lease: Lease) -> float | None:
    return s.usage.idle_since(lease, max(lease.last_activity or 0.0, lease.granted_at or 0.0))


def walked(s: Scheduler, now: float) -> list[tuple[str, str]]:
    """What the heartbeat and idle rules must do at `now`, found by walking every active lease in
    the scheduler's order: holders silent for more than heartbeat_ttl end; then granted leases
    idle for their idle timeout are warned, and those warned idle_grace ago end."""
    leases, ttl, out = list(s._book.by_id.values()), s.policy.heartbeat_ttl, []
    dead = {l.id for l in leases if ttl and now - (l.heartbeat_at or l.created_at) > ttl}
    out += [("lease.expired", l.id) for l in leases if l.id in dead]
    for lease in leases:
        if lease.id in dead or lease.state is not LeaseState.GRANTED or not lease.idle_timeout:
            continue
        since = idle_since(s, lease)
        if since is None:
            continue
        if lease.idle_warned_at is None and now - since >= lease.idle_timeout:
            out.append(("lease.idle_warning", lease.id))
        elif lease.idle_warned_at is not None and now - lease.idle_warned_at >= s.policy.idle_grace:
            out.append(("lease.expired", lease.id))
    return out


def moments(s: Scheduler, lease: Lease) -> tuple[int | None, int | None]:
    """The seconds a lease's heartbeat and idle moments fall in, worked out from the lease alone."""
    ttl = s.policy.heartbeat_ttl
    beat = math.floor((lease.heartbeat_at or lease.created_at) + ttl) if ttl else None
    since = idle_since(s, lease) if lease.state is LeaseState.GRANTED and lease.idle_timeout else None
    if since is None:
        return beat, None
    idle = since + lease.idle_timeout if lease.idle_warned_at is None else lease.idle_warned_at + s.policy.idle_grace
    return beat, math.floor(idle)


POLICIES = {
    "activity": dict(idle_signal="activity"),
    "gpu": dict(idle_signal="gpu"),
    "both, busy released": dict(idle_signal="both", release_busy=True),
}


@pytest.mark.parametrize("signal", POLICIES)
def test_tick_acts_as_a_walk_over_every_lease(store_urls, signal):
    """Random submits, heartbeats, touches (activity, busy flips), GPU samples, releases, refused
    writes and ticks at random times: before each tick a walk over every lease says which the
    heartbeat and idle rules must end or warn; the tick announces exactly those, in that order,
    and leaves them in that state. After every step each active lease is filed at the second of
    its moments, as worked out from the lease alone."""
    store = FlakyStore(store_urls.fresh())
    events: list = []
    s = Scheduler(SimulatedBackend(fleet({"model": "L4", "count": 2}, nodes=2)), store,
                  SchedulerPolicy(heartbeat_ttl=20, idle_timeout=12, idle_grace=5, wait_for_holders=False,
                                  **POLICIES[signal]), listeners=[events.append])
    rng = random.Random(f"moments {signal}")
    now, ticks, acted = 0.0, 0, 0
    for step in range(700):
        now += rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 4), rng.uniform(0, 9)])
        leases = s.leases()
        pick = rng.choice(leases) if leases else None
        op = rng.random()
        if rng.random() < 0.05:
            store.fail_next.add("save")
        try:
            if op < 0.2 or pick is None:
                s.submit(f"u{rng.randrange(4)}", f"kernel:{step}", rng.choice(SPECS), now=now,
                         wait=rng.random() < 0.7, idle_timeout=rng.choice([None, None, 6.0, 30.0]))
            elif op < 0.35:
                user = rng.choice(leases).user
                s.heartbeat(user, None if rng.random() < 0.5 else [pick.holder], now=now)
            elif op < 0.55:
                s.touch(pick.id, now=now, busy=rng.choice([None, None, True, False]),
                        last_activity=rng.choice([None, now, now - rng.uniform(0, 20)]))
            elif op < 0.65 and pick.state is LeaseState.GRANTED:
                s.sample_gpu(pick.id, now=now, sm_percent=rng.choice([0.0, 3.0, 80.0]))
            elif op < 0.7:
                s.release(pick.id, now=now)
            else:
                expected = walked(s, now)
                before = len(events)
                s.tick(now)
                announced = [(e.type, e.lease_id) for e in events[before:] if e.type in RULED]
                assert announced == expected, f"step {step} at {now}"
                for kind, lease_id in expected:
                    lease = s.lease(lease_id)
                    assert (lease.state, lease.idle_warned_at) == (
                        (LeaseState.EXPIRED, lease.idle_warned_at) if kind == "lease.expired"
                        else (LeaseState.GRANTED, now)), f"step {step}"
                ticks += 1
                acted += len(expected)
        except (SchedulerError, StoreFailed):
            pass  # a refused write: the change is undone, its leases held (and filed) again as they were
        store.fail_next.clear()
        for lease in s.leases():
            filed = s._heartbeats.second_of(lease.id), s._idle.second_of(lease.id)
            assert filed == moments(s, lease), f"step {step}: {lease.id} filed at {filed}"
    assert ticks > 100 and acted > 20  # the rules did act, many times
    store.close()


def test_a_tick_reads_only_the_seconds_that_have_come():
    """Filed leases come up once their second has come (a second reached but for rounding too),
    each filed again at its moment as it is then; a lease moved or forgotten comes up as it is."""
    at: dict[str, float | None] = {"a": 10.5, "b": 11.0, "c": 30.0, "d": 12.0}
    leases = {name: Lease(id=name, user="u", holder=f"kernel:{name}", spec=SPECS[0], priority=PriorityClass.INTERACTIVE,
                          state=LeaseState.GRANTED, created_at=0.0, seq=seq) for seq, name in enumerate(at)}
    index = LeaseMoments(lambda lease: at[lease.id])
    for lease in leases.values():
        index.file(lease)
    assert index.due(9.999) == []
    at["c"] = 10.2  # moved earlier: filed again
    index.file(leases["c"])
    index.forget("d")
    assert sorted(lease.id for lease in index.due(10.0)) == ["a", "c"]
    assert (index.second_of("a"), index.second_of("b"), index.second_of("d")) == (10, 11, None)
    at["a"] = None  # no moment now (a busy holder): it comes up once more, then is out
    assert sorted(lease.id for lease in index.due(11.0 - 1e-12)) == ["a", "b", "c"]
    assert index.second_of("a") is None
    assert sorted(lease.id for lease in index.due(100.0)) == ["b", "c"]
