"""The magic's pieces that need no kernel: holder names, specs, usage, status words."""

import shlex

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpualloc.kernel.arguments import ACTIONS, JOB_WORDS, gpu_parser, parse_gpu_line, request_arguments, \
    spec_from_args
from jupyter_gpualloc.kernel.magics import Progress, kernel_holder
from jupyter_gpualloc.kernel.sizes import InputError
from jupyter_gpualloc.kernel.status import cap_mechanism, idle_text, job_state_text, job_submitted_text, mig_memory, \
    status_lines


def test_holder_from_the_environment_else_the_connection_file():
    assert kernel_holder({"GPUALLOC_HOLDER": "kernel:abc"}, "/run/kernel-zzz.json") == "kernel:abc"
    assert kernel_holder({}, "/run/jupyter/kernel-4f2a-99.json") == "kernel:4f2a-99"
    assert kernel_holder({}, None).startswith("kernel:pid-")


@pytest.mark.parametrize("args, spec", [
    (("10GB", None, None, None, None), {"kind": "any", "memory_gib": 10.0}),
    (("", "3g.40gb", None, None, "H100"), {"kind": "mig", "profile": "3g.40gb", "model": "H100"}),
    (("", None, "8GB", None, None), {"kind": "shared", "memory_gib": 8.0}),
    (("", None, "1536MB", None, None), {"kind": "shared", "memory_gib": 1.5}),
    (("", None, None, 2, "L4"), {"kind": "whole", "count": 2, "model": "L4"}),
])
def test_specs(args, spec):
    assert spec_from_args(*args) == spec


def test_offers_turn_into_request_arguments():
    assert request_arguments({"kind": "mig", "profile": "1g.10gb", "model": "H100"}) == "--mig 1g.10gb --model H100"
    assert request_arguments({"kind": "shared", "memory_gib": 8, "model": "H100 80GB HBM3"}) == \
        "--shared 8GB --model 'H100 80GB HBM3'"
    assert request_arguments({"kind": "whole", "count": 2}) == "--whole 2"
    assert request_arguments({"kind": "any", "memory_gib": 10}) == "10GB"


@pytest.mark.parametrize("spec", [
    {"kind": "mig", "profile": "1g.10gb", "model": "H100 80GB HBM3"},
    {"kind": "shared", "memory_gib": 8.0, "model": "RTX A6000"},
    {"kind": "whole", "count": 2, "model": "L4"},
    {"kind": "any", "memory_gib": 10.0},
])
def test_what_offers_print_parses_back_to_the_offer(spec):
    """The suggestion, pasted after '%gpu request', is read as a shell would and asks for the same spec."""
    args = gpu_parser().parse_args(shlex.split(f"request {request_arguments(spec)}"))
    assert spec_from_args(" ".join(args.size), args.mig, args.shared, args.whole, args.model) == spec


def test_exactly_one_kind():
    with pytest.raises(InputError, match="say what to request"):
        spec_from_args("", None, None, None, None)
    with pytest.raises(InputError, match=r"got a size and --shared"):
        spec_from_args("4GB", None, "8GB", None, None)


def test_usage_is_the_magics_help():
    """%gpu? shows argparse's usage as people type it: no reST '::' and no '<[N]>' placeholders."""
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_gpualloc")
    doc = shell.find_line_magic("gpu").__doc__
    assert doc.startswith("usage: %gpu [ACTION] [SIZE] [--mig PROFILE | --shared SIZE | --whole [N]]")
    assert "::" not in doc and "<" not in doc
    flat = " ".join(doc.split())
    for words in ("--whole [N] N whole GPUs", "--no-wait", "10GB, 10G, 10GiB or 10240MB", "%gpu job logs"):
        assert words in flat
    # the size rule as the core applies it (core/plans.py pick_profile): NVIDIA's profile names are not GiB
    assert ("You get the smallest MIG profile whose name says that much where one fits, else a shared slice "
            "capped at exactly that much. NVIDIA's profile names round up: 10GB gets a 1g.10gb, which has "
            "9.5 GiB on an A100 80GB") in flat
    cell_doc = shell.find_cell_magic("gpu").__doc__
    assert cell_doc.startswith("usage: %%gpu job [--mem SIZE | --mig PROFILE") and "::" not in cell_doc
    shell.run_line_magic("unload_ext", "jupyter_gpualloc")


def test_an_unknown_action_names_every_action_the_magic_has():
    with pytest.raises(InputError) as err:
        parse_gpu_line("frobnicate")
    assert str(err.value) == ("'frobnicate' is not a %gpu action: use one of "
                              "request, release, status, offers, list, usage, extend, job, jobs")
    assert JOB_WORDS == ("job", "jobs") and "request" in ACTIONS
    assert parse_gpu_line("").action == "status"


SHARED = {"id": "l1", "state": "granted", "last_activity": 1000.0, "idle_timeout": 1800.0, "idle_warned_at": None,
          "spec": {"kind": "shared", "memory_gib": 8},
          "slice": {"kind": "shared", "node": "n0", "model": "L4", "gpu_uuids": ["GPU-1"], "memory_mib": 8192,
                    "visible_devices": "GPU-1"}}


def test_cap_mechanisms_strongest_first():
    slice_ = SHARED["slice"]
    env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M", "LD_PRELOAD": "/opt/hami/libvgpu.so"}
    assert cap_mechanism(slice_, env, "PyTorch (fraction 0.35)") == (
        "shared 8 GiB: MPS pinned-memory limit; HAMi-core; framework caps: PyTorch (fraction 0.35)")
    assert cap_mechanism({**slice_, "kind": "whole"}, {}) == "whole GPU: no cap"


def test_idle_countdown_words():
    assert idle_text(SHARED, now=1000.0 + 60) == "warning in 29m (released when idle for 30m plus a grace period)"
    assert idle_text(SHARED, now=1000.0 + 4000) == "idle for over 30m: a warning is due"
    assert idle_text({**SHARED, "idle_warned_at": 2800.0}, now=2900.0).startswith("warned:")
    assert idle_text({**SHARED, "idle_timeout": None}, now=0) is None
    # the service's own account: the warning's time, the grace after it, a running cell
    release = {"since": 1000.0, "warn_at": 2800.0, "release_at": 2920.0, "grace": 120.0, "warned": False}
    assert idle_text({**SHARED, "idle_release": release}, now=1060.0) == (
        "warning in 29m, then released 2m later unless a cell runs (idle release after 30m idle)")
    assert idle_text({**SHARED, "idle_release": {**release, "warned": True}}, now=2860.0) == (
        "warned: released in 1m unless this kernel is used (or extended)")
    assert idle_text({**SHARED, "idle_release": None}, now=1060.0).startswith("not idle now (a cell runs)")


def test_status_without_a_lease_and_while_queued():
    assert status_lines(None, now=0, in_effect=False, environ={}) == [
        "gpu: this kernel holds no GPU slice (%gpu request 10GB asks for one)"]
    queued = {"id": "l2", "state": "queued", "position": 3, "spec": {"kind": "mig", "profile": "3g.40gb"}}
    assert status_lines(queued, now=0, in_effect=False, environ={})[0] == (
        "gpu: queued at position 3 for a 3g.40gb slice (lease l2)")


def test_a_job_whose_slice_is_granted_is_starting_not_queued_at_position_0():
    assert job_submitted_text({"state": "queued", "position": 0}) == "has its slice and is starting"
    assert job_submitted_text({"state": "queued", "position": 2}) == "queued at position 2"
    assert job_submitted_text({"state": "queued"}) == "queued"
    assert job_state_text({"state": "queued", "position": 0}, now=0) == "starting (it has its slice)"
    assert job_state_text({"state": "queued", "position": 0, "attempts": 1}, now=0) == (
        "starting (it has its slice, attempt 2)")
    assert job_state_text({"state": "queued", "position": 1}, now=0) == "queued (position 1)"
    assert job_state_text({"state": "queued", "position": 1, "reason": "user quota for alice: at most 2 slices"},
                          now=0) == "queued (position 1): user quota for alice: at most 2 slices"


def test_a_mig_grant_says_its_memory_and_why_it_is_less_than_asked():
    granted = {"slice": {"kind": "mig", "profile": "1g.10gb", "memory_mib": 9728}}
    assert mig_memory({**granted, "spec": {"kind": "any", "memory_gib": 10}}) == (
        "9.5 GiB of GPU memory (a 1g.10gb answers a 10 GiB request: NVIDIA's profile names round up)")
    assert mig_memory({**granted, "spec": {"kind": "any", "memory_gib": 9}}) == "9.5 GiB of GPU memory"
    assert mig_memory({**granted, "spec": {"kind": "mig", "profile": "1g.10gb"}}) == "9.5 GiB of GPU memory"


def test_progress_in_a_terminal_rewrites_one_line(capsys):
    progress = Progress(in_kernel=False)
    progress.show("gpu: queued: position 12")
    progress.show("gpu: queued: position 3")
    progress.done("gpu: granted")
    assert capsys.readouterr().out == ("\rgpu: queued: position 12" + "\rgpu: queued: position 3 "
                                       + "\r" + "gpu: granted".ljust(23) + "\n")


def test_restart_is_only_for_request_and_only_where_a_server_restarts_kernels_into_pods(capsys):
    from jupyter_gpualloc.kernel.magics import GpuMagics, KernelGpu

    shell = InteractiveShell.instance()
    gpu = KernelGpu(environ={"GPUALLOC_URL": "http://127.0.0.1:9/", "GPUALLOC_TOKEN": "t",
                             "GPUALLOC_HOLDER": "kernel:k1"}, in_kernel=False)
    magics = GpuMagics(shell, gpu)
    for line, said in (("release --restart", "'%gpu release' takes no size or options"),
                       ("request 10GB --restart --wait 1m", "leave out --wait and --no-wait"),
                       ("request 10GB --restart", "--restart is for a kernel of a Jupyter server whose GPU "
                                                  "kernels run in pods of their own (Kubernetes)")):
        magics.gpu(line)
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err  # one line, no traceback, nothing sent
