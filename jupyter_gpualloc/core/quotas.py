"""Quotas on what users and groups hold at once: a function of the policy and the active leases.

`quota_block` names the quota that granting a request would break, or None. To add a quota
kind, add its key to the policy's quotas (policy.py), to `asked` and to `in_use` here, and its
unit to `amount`. Usage quotas (GPU-hours over a window) live in usage.py.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .errors import QuotaExceeded
from .indexes import ActiveLeases
from .model import MIB_PER_GIB, Lease, LeaseState, SliceKind
from .plans import Plan
from .policy import SchedulerPolicy


def quota_block(policy: SchedulerPolicy, active: ActiveLeases, user: str, groups: Sequence[str],
                plans: Sequence[Plan], lease_id: str | None, *, assume_empty: bool = False) -> QuotaExceeded | None:
    """The quota that granting the cheapest of `plans` to `user` (in `groups`) would break, counting
    the granted leases other than `lease_id` (nothing held at all, when `assume_empty`), or None.
    O(the user's and its groups' leases)."""
    scopes = []
    limits = policy.user_quota(user)
    if limits:
        scopes.append(("user", user, limits, active.of_user(user)))
    if groups:
        group_quotas = policy.group_quotas
        for group in groups:
            limits = group_quotas.get(group)
            if limits:
                scopes.append(("group", group, limits, active.of_group(group)))
    if not scopes:
        return None  # no quota applies: nothing to count
    ask = asked(min(plans, key=lambda p: p.memory_mib))
    for scope, who, limits, held in scopes:
        held = [] if assume_empty else [l for l in held if l.state is LeaseState.GRANTED and l.id != lease_id]
        used = in_use(held)
        for key, limit in limits.items():
            if ask[key] and used[key] + ask[key] > limit + 1e-9:
                return _exceeded(scope, who, key, limit, used[key], ask[key], assume_empty)
    return None


def asked(plan: Plan) -> dict[str, float]:
    """What a plan counts against each quota kind."""
    return {"slices": 1, "memory_gib": plan.memory_mib / MIB_PER_GIB,
            "whole_gpus": plan.count if plan.kind is SliceKind.WHOLE else 0}


def in_use(held: Iterable[Lease]) -> dict[str, float]:
    """What granted leases count against each quota kind."""
    held = list(held)
    return {"slices": len(held),
            "memory_gib": sum(l.slice.memory_mib for l in held) / MIB_PER_GIB,
            "whole_gpus": sum(len(l.slice.gpu_uuids) for l in held if l.slice.kind is SliceKind.WHOLE)}


def amount(key: str, value: float) -> str:
    """A quota amount with its unit: '20 GiB', '79.6 GiB', '1 slice', '2 whole GPUs'."""
    if key == "memory_gib":
        return f"{value:.1f}".removesuffix(".0") + " GiB"
    unit = {"slices": "slice", "whole_gpus": "whole GPU"}[key]
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


def _exceeded(scope: str, who: str, key: str, limit: float, used: float, ask: float,
              assume_empty: bool) -> QuotaExceeded:
    at_most = f"at most {amount(key, limit)}"
    what = " of GPU memory" if key == "memory_gib" else ""
    if assume_empty:
        detail = f"{at_most}{what}, and this request alone needs {amount(key, ask)}"
    else:
        detail = f"{at_most}{what} ({amount(key, used)} in use; this request needs {amount(key, ask)})"
    error = QuotaExceeded(scope, key, limit, f"{scope} quota for {who}: {detail}")
    error.limit_text = at_most
    return error
