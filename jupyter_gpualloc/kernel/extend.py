"""`%gpu extend`: move a time-boxed lease's deadline later; its words for a deadline; one line of text.

The lease extended is this kernel's own, else (a kernel on its JupyterHub server's slice) the
server's, which the spawner's progress page points to.
"""

from __future__ import annotations

from datetime import datetime, timezone

from .sizes import InputError, format_duration


def moment_text(at: float, now: float | None = None) -> str:
    """'2026-11-02 16:00 UTC (in 3h 59m)' (without 'in ...' when now is None; whole minutes past an hour)."""
    left = None if now is None else at - now
    if left is not None and left >= 3600:
        left = round(left / 60) * 60
    soon = f" (in {format_duration(left)})" if left is not None else ""
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") + soon


def extensions_text(left: int) -> str:
    return f"{left} extension{'' if left == 1 else 's'} left"


def deadline_text(deadline: dict, now: float | None = None) -> str:
    """'until 2026-11-02 16:00 UTC (in 3h 59m), 1 extension left' (without 'in ...' when now is None)."""
    return f"until {moment_text(deadline['at'], now)}, {extensions_text(deadline['extensions_left'])}"


def extend_lease(client, lease_id: str) -> dict:
    """POST /leases/<id>/extend; a refusal (409) becomes InputError('cannot extend lease ...: why')."""
    from ..client import NoCapacity

    try:
        return client.extend(lease_id)
    except NoCapacity as err:
        raise InputError(f"cannot extend lease {lease_id}: {err.reason}") from None


def extend_lines(kernel_gpu) -> list[str]:
    """Extend the kernel's granted lease (or its server's) and say until when."""
    lease = kernel_gpu.current()
    whose = ""
    if lease is None or lease["state"] != "granted":
        lease, whose = kernel_gpu.server_lease(), "your server's "
    if lease is None:
        return ["gpu: this kernel holds no GPU slice to extend"]
    extended = extend_lease(kernel_gpu.client, lease["id"])
    return [f"gpu: {whose}lease {lease['id']} extended {deadline_text(extended['deadline'], kernel_gpu.clock())}"]
