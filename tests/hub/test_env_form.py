"""The lease -> env mapping and the form's strict validation (no hub needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jupyter_gpualloc.core.model import Lease, LeaseState, PriorityClass, Slice, SliceKind, SliceSpec
from jupyter_gpualloc.hub import form
from jupyter_gpualloc.lease_env import SLICE_ENV_NAMES, slice_env

URL = "http://127.0.0.1:8765/services/gpualloc/"


def granted(sl: Slice) -> dict:
    return Lease(id="L1", user="alice", holder="server", spec=SliceSpec(kind=sl.kind),
                 priority=PriorityClass.INTERACTIVE, state=LeaseState.GRANTED, created_at=0.0, seq=1,
                 slice=sl).to_json()


MIG = Slice(SliceKind.MIG, "local", ("GPU-1",), 9984, profile="1g.10gb", start=6, mig_uuid="MIG-9", model="A100")
SHARED = Slice(SliceKind.SHARED, "local", ("GPU-2",), 8192, milli=101, model="H100 80GB HBM3")
WHOLE = Slice(SliceKind.WHOLE, "local", ("GPU-3", "GPU-4"), 23034, model="L4")


def test_mig_lease_names_the_mig_device_only():
    env = slice_env(granted(MIG), service_url=URL)
    assert env == {"GPUALLOC_URL": URL, "GPUALLOC_LEASE_ID": "L1", "GPUALLOC_SLICE_KIND": "mig",
                   "CUDA_VISIBLE_DEVICES": "MIG-9"}


def test_whole_gpus_in_containers():
    env = slice_env(granted(WHOLE), containers=True)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "GPU-3,GPU-4"
    assert "GPUALLOC_MEMORY_LIMIT_MIB" not in env


def test_shared_lease_gets_every_memory_cap():
    env = slice_env(granted(SHARED), gpu_memory_mib=81920, mps=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-2"
    assert env["GPUALLOC_MEMORY_LIMIT_MIB"] == "8192"
    assert env["GPUALLOC_MEMORY_FRACTION"] == env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.1"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "8192m"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert env["CUPY_GPU_MEMORY_LIMIT"] == str(8 * 1024 ** 3)
    assert set(env) <= set(SLICE_ENV_NAMES)


def test_shared_lease_without_mps_or_gpu_size_uses_the_share():
    env = slice_env(granted(SHARED))
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    assert env["GPUALLOC_MEMORY_FRACTION"] == "0.101"


def test_no_lease_hides_every_gpu():
    assert slice_env(None, service_url=URL) == {"GPUALLOC_URL": URL, "CUDA_VISIBLE_DEVICES": ""}
    assert slice_env(None, containers=True)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert slice_env(None, visible_devices=False) == {}


def test_a_queued_lease_has_no_env():
    lease = granted(MIG) | {"state": "queued", "slice": None}
    with pytest.raises(ValueError, match="queued"):
        slice_env(lease)


def test_env_module_imports_without_jupyterhub():
    code = ("import sys; import jupyter_gpualloc.lease_env; "
            "bad = [m for m in ('jupyterhub', 'tornado', 'kubespawner') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


OFFERS = [form.no_gpu_offer(),
          {"name": "mig-1g.10gb", "label": "MIG 1g.10gb", "spec": {"kind": "mig", "profile": "1g.10gb"},
           "available": 4},
          {"name": "whole-h100", "label": "Whole <H100>", "spec": {"kind": "whole"}, "available": 0},
          {"name": "whole-a100", "label": "Whole A100", "spec": {"kind": "whole"}, "available": 2,
           "over_quota": "at most 20 GiB"}]


def test_form_lists_offers_with_what_is_free():
    html = form.render_form(OFFERS, "whole-h100")
    assert html.count('type="radio"') == 4
    assert "MIG 1g.10gb <small class=\"text-muted\">(4 free now)</small>" in html
    assert "Whole &lt;H100&gt;" in html and "none free now: you will wait in the queue" in html
    assert 'value="whole-h100" checked' in html and 'value="none" checked' not in html
    assert 'value="none" checked' in form.render_form(OFFERS, "gone")


def test_form_says_when_the_users_quota_is_full_now_instead_of_what_is_free():
    full = {**OFFERS[1], "quota_full": "user quota for carol: at most 2 slices (2 slices in use; this request "
                                       "needs 1 slice)"}
    html = form.render_form([form.no_gpu_offer(), full])
    assert "free now" not in html
    assert "your quota is full now: user quota for carol: at most 2 slices (2 slices in use" in html


def test_form_greys_out_what_the_quota_never_allows():
    html = form.render_form(OFFERS, "whole-a100")
    assert 'value="whole-a100" disabled' in html and "(over your quota: at most 20 GiB)" in html
    assert 'value="none" checked' in html and "checked disabled" not in html


def test_the_gpu_field_is_read_strictly():
    assert form.gpu_from_form(["mig-1g.10gb"]) == "mig-1g.10gb"
    for bad in ([], ["a", "b"], [" "]):
        with pytest.raises(form.OptionsError, match="exactly one"):
            form.gpu_from_form(bad)


def test_user_options_must_name_an_offer():
    assert form.chosen_name({"gpu": "mig-1g.10gb"}) == "mig-1g.10gb"
    assert form.chosen_name({}) == form.chosen_name(None) == "none"
    assert form.chosen_name({"profile": "big", "image": "x"}, default="whole-h100") == "whole-h100"
    assert form.choose_offer("mig-1g.10gb", OFFERS)["spec"]["profile"] == "1g.10gb"
    with pytest.raises(form.OptionsError, match="no GPU offer named 'mig-7g' for you: choose one of none, "):
        form.choose_offer("mig-7g", OFFERS)
    for message, options in {"must be the name of a GPU offer": {"gpu": 3}, "must be an object": ["gpu"]}.items():
        with pytest.raises(form.OptionsError, match=message):
            form.chosen_name(options)


def test_form_shows_the_time_limit_and_the_usage_standing():
    offers = [form.no_gpu_offer(), OFFERS[1] | {"max_duration": 14400, "max_extensions": 2},
              OFFERS[2] | {"max_duration": 5400, "max_extensions": 0}]
    html = form.render_form(offers, standing=["you have used 12.50 of 40 GPU-hours this week"])
    assert '<p class="gpualloc-usage small">GPU usage: you have used 12.50 of 40 GPU-hours this week</p>' in html
    assert "(4 free now; up to 4 h, extendable 2x)" in html
    assert "(none free now: you will wait in the queue; up to 1 h 30 min, not extendable)" in html


def test_form_greys_out_every_gpu_offer_a_used_up_usage_quota_refuses():
    used_up = "you have used 40.00 of 40 GPU-hours this week (resets Mon 2026-12-07 00:00 UTC)"
    offers = [form.no_gpu_offer()] + [o | {"over_usage_quota": used_up} for o in OFFERS[1:3]]
    html = form.render_form(offers, "mig-1g.10gb")
    assert html.count(" disabled>") == 2 and 'value="none" checked' in html
    assert f"(usage quota used up: {used_up})" in html


def test_moments_and_durations_read_plainly():
    monday_noon = 1796644800.0  # 2026-12-07 12:00 UTC, a Monday
    assert form.clock_text(monday_noon + 7200, monday_noon) == "14:00 UTC"
    assert form.clock_text(monday_noon + 14 * 3600, monday_noon) == "Tue 02:00 UTC"
    assert form.clock_text(monday_noon + 30 * 86400, monday_noon) == "2027-01-06 12:00 UTC"
    assert [form.hours_text(s) for s in (14400, 5400, 600)] == ["4 h", "1 h 30 min", "10 min"]


def test_form_says_how_much_of_the_users_reservation_is_free():
    html = form.render_form(OFFERS, reservations=["ml101 reservation: 22 of 30 free until 12:00 UTC"])
    assert '<p class="gpualloc-reservation small">ml101 reservation: 22 of 30 free until 12:00 UTC</p>' in html
