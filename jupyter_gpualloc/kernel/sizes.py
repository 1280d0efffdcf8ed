"""Sizes and durations as people type them in `%gpu`: `10GB`, `10240MB`, `10m`, `1h30m`.

A size is GPU memory in MiB. `GB`, `G` and `GiB` all mean GiB (2**30 bytes); `MB`, `M` and `MiB`
mean MiB. NVIDIA's MIG profile names are not GiB (`1g.10gb` has 9.5 GiB on an A100 80GB): the core
lets a profile answer the size in its name (core/plans.py pick_profile), and a grant says the memory.
"""

from __future__ import annotations

import math
import re

MIB_PER_GIB = 1024

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(gib|gb|g|mib|mb|m)\s*", re.IGNORECASE)
_UNIT_MIB = {"gib": MIB_PER_GIB, "gb": MIB_PER_GIB, "g": MIB_PER_GIB, "mib": 1, "mb": 1, "m": 1}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s)", re.IGNORECASE)
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0}


class InputError(ValueError):
    """Something typed in a magic that cannot be understood; the message is one line for people."""


def parse_size(text: str) -> int:
    """'10GB', '10G', '10GiB', '10240MB' (case-insensitive, decimals allowed) -> MiB."""
    match = _SIZE.fullmatch(text)
    mib = math.ceil(float(match.group(1)) * _UNIT_MIB[match.group(2).lower()]) if match else 0
    if mib <= 0:
        raise InputError(f"size '{text}' not understood: use e.g. 10GB, 10G, 10GiB or 10240MB")
    return mib


def parse_duration(text: str) -> float:
    """'90' or '90s', '10m', '1h', '1h30m' -> seconds."""
    stripped = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", stripped):
        return float(stripped)
    parts = _DURATION_PART.findall(stripped)
    if not parts or _DURATION_PART.sub("", stripped).strip():
        raise InputError(f"duration '{text}' not understood: use e.g. 30s, 10m, 1h or 1h30m")
    return sum(float(n) * _SECONDS[unit.lower()] for n, unit in parts)


def format_mib(mib: float) -> str:
    """8192 -> '8 GiB', 4864 -> '4.75 GiB', 512 -> '512 MiB'."""
    if mib >= MIB_PER_GIB:
        return f"{round(mib / MIB_PER_GIB, 2):g} GiB"
    return f"{mib:g} MiB"


def format_duration(seconds: float) -> str:
    """3725 -> '1h 2m 5s', 300 -> '5m', 42.4 -> '42s'."""
    total = max(0, int(round(seconds)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n]
    return " ".join(parts) or "0s"
