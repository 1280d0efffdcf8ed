"""GPU-hours reports for people: the lines `%gpu usage` and `jupyter-gpualloc usage` print.

Reads the service's GET /usage answer; imports nothing but the standard library.
"""

from __future__ import annotations

from datetime import datetime, timezone

HEADINGS = {"user": "user", "group": "group", "model": "GPU model", "kind": "slice kind", "offer": "offer",
            "holder_kind": "holder", "day": "day (UTC)", "reservation": "reservation"}


def _moment(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def usage_lines(report: dict) -> list[str]:
    """A table of GPU-hours and GiB-hours per row of the report, its total, then each usage quota."""
    by = report["by"]
    lines = [f"GPU usage from {_moment(report['since'])} to {_moment(report['until'])}"
             + (f" for {report['user']}" if report.get("user") else " for everyone")]
    rows = report["rows"]
    if not rows:
        lines.append("no GPU time in this period")
    else:
        width = max([len(HEADINGS[by])] + [len(str(r[by]) or "-") for r in rows])
        lines.append(f"{HEADINGS[by]:<{width}}  {'GPU-hours':>10}  {'GiB-hours':>10}  {'leases':>6}")
        for row in rows:
            lines.append(f"{str(row[by]) or '-':<{width}}  {row['gpu_hours']:>10.2f}  {row['gib_hours']:>10.2f}"
                         f"  {row['leases']:>6}")
        total = report["total"]
        lines.append(f"{'total':<{width}}  {total['gpu_hours']:>10.2f}  {total['gib_hours']:>10.2f}")
    lines.extend(quota["message"] for quota in report.get("quotas", []))
    return lines


def efficiency_lines(report: dict) -> list[str]:
    """The least efficient leases first: GPU-hours held and busy, and a sentence each."""
    lines = [f"GPU efficiency from {_moment(report['since'])} to {_moment(report['until'])}"
             + (f" for {report['user']}" if report.get("user") else " for everyone")]
    if not report["rows"]:
        return lines + ["no lease reported its GPU utilisation in this period"]
    lines.append(f"{'lease':<18}  {'GPU-hours':>10}  {'busy':>10}  {'efficiency':>10}")
    for row in report["rows"]:
        lines.append(f"{row['lease_id']:<18}  {row['gpu_hours']:>10.2f}  {row['busy_gpu_hours']:>10.2f}"
                     f"  {row['efficiency']:>10.0%}  {row['message']}")
    return lines

