"""`%gpu usage` and `%gpu extend` in a real kernel."""

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
        assert kernel.run("%gpu extend").stdout.strip() == "gpu: this kernel holds no GPU slice to extend"
        assert kernel.run("%gpu request 4GB").status == "ok"
        refused = kernel.run("%gpu extend")  # this service's policy sets no max_duration
        assert refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1
        assert "this lease has no deadline to extend" in refused.stderr
        assert kernel.run("%gpu release").status == "ok"
    finally:
        kernel.shutdown()
