"""`%gpu usage` in a real kernel: this month's GPU-hours of the kernel's user, per GPU model."""

from __future__ import annotations

import re

from tests.kernel.conftest import ALICE


def test_usage_shows_this_months_gpu_hours_per_model(service, start_kernel):
    kernel = start_kernel(ALICE)
    try:
        assert kernel.run("%gpu request 4GB").status == "ok"
        assert kernel.run("%gpu release").status == "ok"
        cell = kernel.run("%gpu usage")
        assert cell.status == "ok" and not cell.stderr, cell
        lines = cell.stdout.splitlines()
        assert re.fullmatch(r"GPU usage from \d{4}-\d\d-01 00:00 UTC to .* UTC for alice", lines[0])
        assert re.fullmatch(r"GPU model +GPU-hours +GiB-hours +leases", lines[1])
        assert lines[2].split()[0] == "A100-SXM4-40GB" and lines[2].split()[-1] == "1"
        assert lines[3].startswith("total")
        wrong = kernel.run("%gpu usage 4GB")
        assert wrong.stderr.strip() == "gpu: '%gpu usage' takes no size or options"
    finally:
        kernel.shutdown()
