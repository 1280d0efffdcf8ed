"""`%gpu extend`: move this kernel's time-boxed lease's deadline later; one line of text."""

from __future__ import annotations

from datetime import datetime, timezone


def deadline_text(deadline: dict) -> str:
    """'until 2026-11-02 16:00 UTC, 1 extension left'."""
    at = datetime.fromtimestamp(deadline["at"], timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    left = deadline["extensions_left"]
    return f"until {at}, {left} extension{'' if left == 1 else 's'} left"


def extend_lines(kernel_gpu) -> list[str]:
    """Extend the kernel's granted lease and say until when."""
    lease = kernel_gpu.current()
    if lease is None or lease["state"] != "granted":
        return ["gpu: this kernel holds no GPU slice to extend"]
    extended = kernel_gpu.client.extend(lease["id"])
    return [f"gpu: lease {lease['id']} extended {deadline_text(extended['deadline'])}"]
