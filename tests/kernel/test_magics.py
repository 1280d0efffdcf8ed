"""`%gpu` in real kernels, against a running service with a simulated fleet.

The main kernel has no GPUALLOC_HOLDER, so its holder comes from its connection file's name.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
import urllib.error

import pytest

from jupyter_gpualloc.lease_env import KEPT_ALIVE_VARIABLE, slice_env
from tests.kernel.conftest import ALICE, BOB, CAROL, assert_one_line_error


@pytest.fixture(scope="module")
def kernel(start_kernel):
    return start_kernel()


@pytest.fixture(autouse=True)
def empty_fleet(service):
    yield
    service.release_all()


def env_of(kernel, *names) -> dict:
    cell = kernel.run(f"import json, os; print(json.dumps({{n: os.environ.get(n) for n in {list(names)!r}}}))")
    return json.loads(cell.stdout)


def mine(service, kernel) -> list[dict]:
    return [lease for lease in service.leases() if lease["holder"] == f"kernel:{kernel.kernel_id}"]


def fill_l4s(service) -> list[dict]:
    """Bob takes both L4s whole."""
    return [service.call("POST", "leases", {"spec": {"kind": "whole", "model": "L4"}, "holder": f"kernel:bob{i}"},
                         token=BOB) for i in range(2)]


def test_request_status_and_release(service, kernel):
    cell = kernel.run("%gpu request 4GB")
    assert cell.status == "ok" and not cell.stderr, cell
    [lease] = mine(service, kernel)
    assert lease["state"] == "granted" and lease["slice"]["profile"] == "1g.5gb"
    mig_uuid = lease["slice"]["mig_uuid"]
    assert cell.stdout.strip() == (f"gpu: granted MIG 1g.5gb on A100-SXM4-40GB (node0) (lease {lease['id']}): "
                                   f"CUDA_VISIBLE_DEVICES={mig_uuid}; 4.75 GiB of GPU memory")
    assert env_of(kernel, "CUDA_VISIBLE_DEVICES", "GPUALLOC_LEASE_ID") == {
        "CUDA_VISIBLE_DEVICES": mig_uuid, "GPUALLOC_LEASE_ID": lease["id"]}

    status = kernel.run("%gpu status")
    [bundle] = status.displays
    assert "application/vnd.jupyter.widget-view+json" in bundle
    text = bundle["text/plain"]
    assert f"gpu: MIG 1g.5gb on A100-SXM4-40GB (node0), lease {lease['id']}" in text
    assert f"CUDA_VISIBLE_DEVICES={mig_uuid} (in effect in this kernel)" in text
    assert "memory cap: MIG instance" in text
    assert re.search(r"idle: warning in (29m \d+s|30m), then released 5m later unless a cell runs", text)  # just started

    listed = kernel.run("%gpu list").stdout
    assert f"* {lease['id']}  kernel:{kernel.kernel_id}" in listed and "granted" in listed

    released = kernel.run("%gpu release")
    assert released.stdout.strip() == f"gpu: released MIG 1g.5gb on A100-SXM4-40GB (node0) (lease {lease['id']})"
    assert mine(service, kernel) == []
    assert env_of(kernel, "CUDA_VISIBLE_DEVICES", "GPUALLOC_LEASE_ID") == {
        "CUDA_VISIBLE_DEVICES": "", "GPUALLOC_LEASE_ID": None}
    after = kernel.run("%gpu status").stdout.strip()
    assert after == f"gpu: no GPU slice; lease {lease['id']} released by alice"
    assert kernel.run("%gpu release").stdout.strip() == "gpu: this kernel holds no GPU slice"


def test_a_size_gets_the_smallest_fit_and_a_shared_slice_gets_its_caps(service, kernel):
    cell = kernel.run("%gpu request 10GB")  # no free MIG profile of 10 GiB: a 10 GiB share of an L4
    assert cell.status == "ok" and not cell.stderr, cell
    [lease] = mine(service, kernel)
    assert lease["slice"]["kind"] == "shared" and lease["slice"]["model"] == "L4"
    assert "memory capped at 10 GiB, fraction 0.4446 of the GPU" in cell.stdout
    env = env_of(kernel, "GPUALLOC_MEMORY_LIMIT_MIB", "GPUALLOC_MEMORY_FRACTION", "CUDA_DEVICE_MEMORY_LIMIT",
                 "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE", "CUPY_GPU_MEMORY_LIMIT")
    assert env == {"GPUALLOC_MEMORY_LIMIT_MIB": "10240", "GPUALLOC_MEMORY_FRACTION": "0.4446",
                   "CUDA_DEVICE_MEMORY_LIMIT": "10240m", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.4446",
                   "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "CUPY_GPU_MEMORY_LIMIT": str(10240 * 2**20)}
    text = kernel.run("%gpu status").displays[0]["text/plain"]
    assert "memory cap: shared 10 GiB: framework caps on import" in text
    kernel.run("%gpu release")
    assert env_of(kernel, "GPUALLOC_MEMORY_LIMIT_MIB", "CUPY_GPU_MEMORY_LIMIT") == {
        "GPUALLOC_MEMORY_LIMIT_MIB": None, "CUPY_GPU_MEMORY_LIMIT": None}


def test_a_size_in_gb_gets_the_profile_named_for_it_and_the_grant_says_its_real_memory(service, kernel):
    # NVIDIA's 1g.5gb has 4.75 GiB on an A100-SXM4-40GB: a 5GB request gets it, and is told so
    cell = kernel.run("%gpu request 5GB")
    assert cell.status == "ok" and not cell.stderr, cell
    [lease] = mine(service, kernel)
    assert lease["slice"]["profile"] == "1g.5gb" and lease["slice"]["memory_mib"] == 4864
    assert cell.stdout.strip().endswith(
        "; 4.75 GiB of GPU memory (a 1g.5gb answers a 5 GiB request: NVIDIA's profile names round up)"), cell


def test_offers_show_how_to_ask_and_each_suggestion_works_when_pasted(service, kernel):
    out = kernel.run("%gpu offers").stdout
    assert out.startswith("gpu: offers")
    assert "%gpu request --mig 1g.5gb --model A100-SXM4-40GB" in out
    assert "%gpu request --whole --model L4" in out
    rows = [re.fullmatch(r"  (.+?) +(\d+) available   (%gpu request .+)", line) for line in out.splitlines()[1:]]
    assert all(rows) and len({row.start(2) for row in rows}) == 1  # the counts line up
    for row in rows:
        if int(row.group(2)) == 0:
            continue
        pasted = kernel.run(row.group(3))
        assert pasted.stdout.startswith("gpu: granted") and not pasted.stderr, (row.group(3), pasted)
        [lease] = mine(service, kernel)
        assert lease["spec"]["model"] == lease["slice"]["model"]
        kernel.run("%gpu release")


def test_models_go_by_the_names_people_know(service, kernel):
    for line in ('%gpu request --whole --model "NVIDIA L4"', "%gpu request --shared 4GB --model nvidia-l4",
                 "%gpu request --mig 1g.5gb --model a100", "%gpu request 4GB --model 'NVIDIA A100-SXM4-40GB'"):
        cell = kernel.run(line)
        assert cell.stdout.startswith("gpu: granted") and not cell.stderr, (line, cell)
        kernel.run("%gpu release")
    with pytest.raises(urllib.error.HTTPError) as err:
        service.call("POST", "leases", {"spec": {"kind": "whole", "model": "H100"}, "holder": "kernel:api"}, token=ALICE)
    assert err.value.code == 400
    assert json.loads(err.value.read()) == {
        "error": "spec.model: no GPU model 'H100' in this fleet: valid models are A100-SXM4-40GB, L4",
        "field": "spec.model"}


def test_waiting_shows_the_position_and_an_interrupt_withdraws(service, kernel):
    fill_l4s(service)
    msg_id = kernel.submit("%gpu request --whole --model L4 --wait 10m")
    queued = kernel.collect(msg_id, until=lambda c: any("position 1" in t for t in c.texts))
    assert "gpu: queued for a whole GPU on L4: position 1" in queued.texts[0]
    assert "(interrupt to withdraw)" in queued.texts[0]
    [lease] = mine(service, kernel)
    assert lease["state"] == "queued" and lease["position"] == 1
    kernel.interrupt()
    rest = kernel.collect(msg_id)
    assert rest.status == "ok" and rest.error is None and "Traceback" not in rest.stderr, rest
    assert rest.stdout.strip() == "gpu: interrupted: request for a whole GPU on L4 withdrawn (was queued at position 1)"
    assert service.call("GET", f"leases/{lease['id']}")["state"] == "cancelled"
    assert mine(service, kernel) == []


def test_a_queued_request_is_granted_when_a_slice_frees(service, kernel):
    bobs = fill_l4s(service)
    msg_id = kernel.submit("%gpu request --whole --model L4 --wait 1m")
    kernel.collect(msg_id, until=lambda c: any("position 1" in t for t in c.texts))
    service.call("DELETE", f"leases/{bobs[0]['id']}?holder_gone=true", token=BOB)
    done = kernel.collect(msg_id)
    assert done.status == "ok" and not done.stderr, done
    assert done.updates[-1]["text/plain"].startswith("gpu: granted after")
    [lease] = mine(service, kernel)
    assert lease["state"] == "granted"
    assert f"gpu: granted whole GPU on L4 (node0) (lease {lease['id']})" in done.stdout
    assert env_of(kernel, "CUDA_VISIBLE_DEVICES")["CUDA_VISIBLE_DEVICES"] == bobs[0]["slice"]["gpu_uuids"][0]


def test_no_capacity_fails_at_once_and_a_short_wait_gives_up(service, kernel):
    fill_l4s(service)
    assert_one_line_error(kernel.run("%gpu request --whole --model L4"),
                          "gpu: no capacity for a whole GPU on L4 now (use --wait to queue)")
    gave_up = kernel.run("%gpu request --whole --model L4 --wait 1s")
    assert gave_up.status == "ok" and not gave_up.stderr, gave_up
    assert gave_up.texts[-1] == ("gpu: no whole GPU on L4 within 1s: request withdrawn "
                                 "(use a longer --wait, or --no-wait)")
    assert mine(service, kernel) == []


def test_no_wait_queues_and_status_applies_the_grant(service, kernel):
    bobs = fill_l4s(service)
    queued = kernel.run("%gpu request --whole --model L4 --no-wait")
    [lease] = mine(service, kernel)
    assert queued.stdout.strip() == (f"gpu: queued at position 1 for a whole GPU on L4 (lease {lease['id']}): "
                                     f"%gpu status applies it once granted")
    assert kernel.run("%gpu status").displays[0]["text/plain"].startswith("gpu: queued at position 1")
    service.call("DELETE", f"leases/{bobs[1]['id']}?holder_gone=true", token=BOB)
    status = kernel.run("%gpu status")
    assert status.stdout.startswith(f"gpu: granted whole GPU on L4 (node0) (lease {lease['id']})")
    assert "(in effect in this kernel)" in status.displays[0]["text/plain"]
    assert env_of(kernel, "CUDA_VISIBLE_DEVICES")["CUDA_VISIBLE_DEVICES"] == bobs[1]["slice"]["gpu_uuids"][0]


def test_cuda_already_initialised_means_restart(service, kernel):
    before = env_of(kernel, "CUDA_VISIBLE_DEVICES")
    kernel.run("import sys, types\n"
               "fake = types.ModuleType('torch'); fake.cuda = types.SimpleNamespace(is_initialized=lambda: True)\n"
               "sys.modules['torch'] = fake")
    try:
        cell = kernel.run("%gpu request 4GB")
        [lease] = mine(service, kernel)
        assert lease["state"] == "granted"
        assert cell.stdout.strip() == (
            f"gpu: granted MIG 1g.5gb on A100-SXM4-40GB (node0) (lease {lease['id']}), but CUDA is already "
            f"initialised in this kernel (torch): restart the kernel to use it (the lease stays with this kernel)")
        assert env_of(kernel, "CUDA_VISIBLE_DEVICES") == before
        text = kernel.run("%gpu status").displays[0]["text/plain"]
        assert "(applies when the kernel restarts)" in text and "gpu: granted" not in text
    finally:
        kernel.run("del sys.modules['torch']")


@pytest.mark.parametrize("line, expected", [
    ("%gpu request 10 bananas", "gpu: size '10 bananas' not understood: use e.g. 10GB, 10G, 10GiB or 10240MB"),
    ("%gpu request --shared lots", "gpu: size 'lots' not understood"),
    ("%gpu request", "gpu: say what to request: e.g. %gpu request 10GB"),
    ("%gpu request 4GB --mig 1g.5gb", "gpu: give one of a size, --mig, --shared or --whole"),
    ("%gpu request 4GB --wait 10x", "gpu: duration '10x' not understood"),
    ("%gpu request 4GB --wait 1m --no-wait", "gpu: give --wait or --no-wait, not both"),
    ("%gpu request --mig 3g.40gb", "gpu: no MIG profile '3g.40gb' in this fleet: valid profiles are 1g.5gb"),
    ("%gpu request --mig 1g.5gb --model L4", "gpu: no MIG GPU on L4 in this fleet offers profile '1g.5gb'"),
    ("%gpu request --whole --model H100", "gpu: no GPU model 'H100' in this fleet: valid models are A100-SXM4-40GB, L4"),
    ("%gpu request --whole --model 'L4", "gpu: No closing quotation (%gpu? shows the usage)"),
    ("%gpu request --mig huge", "gpu: must look like 1g.10gb or 3g.40gb"),
    ("%gpu request --whole 9 --model L4", "gpu: no GPU in this fleet can provide 9 whole GPUs on L4"),
    ("%gpu frobnicate", "gpu: 'frobnicate' is not a %gpu action: use one of request, release, status, offers, "
                        "list, usage, extend, job, jobs (%gpu? shows the usage)"),
    ("%gpu request 10000GB", "gpu: no GPU in this fleet can provide a 10000 GiB GPU slice"),
    ("%gpu request --whole two", "gpu: argument --whole: invalid int value: 'two'"),
    ("%gpu release --model L4", "gpu: '%gpu release' takes no size or options"),
])
def test_input_errors_print_one_line(kernel, line, expected):
    assert_one_line_error(kernel.run(line), expected)


def test_a_second_request_names_the_lease_held(service, kernel):
    kernel.run("%gpu request 4GB")
    [lease] = mine(service, kernel)
    assert_one_line_error(kernel.run("%gpu request 4GB"),
                          f"gpu: this kernel already holds lease {lease['id']}: %gpu release it first")


def test_quota_and_service_errors_print_one_line(service, start_kernel):
    carol = start_kernel(token=CAROL, GPUALLOC_HOLDER="kernel:carol-1")
    assert carol.run("import os; print(os.environ['GPUALLOC_HOLDER'])").stdout.strip() == "kernel:carol-1"
    service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "kernel:carol-0"},
                 token=CAROL)
    assert_one_line_error(carol.run("%gpu request 4GB"), "gpu: user quota for carol: at most 1 slice")

    def reloaded(**env: str | None) -> None:
        code = "".join(f"os.environ.pop({k!r}, None)\n" if v is None else f"os.environ[{k!r}] = {v!r}\n"
                       for k, v in env.items())
        assert carol.run(f"import os\n{code}%reload_ext jupyter_gpualloc").status == "ok"

    reloaded(GPUALLOC_TOKEN="not-a-token")
    assert_one_line_error(carol.run("%gpu status"), "gpu: the gpualloc service refused this kernel's token")
    reloaded(GPUALLOC_URL="http://127.0.0.1:9/", GPUALLOC_TOKEN=CAROL)
    assert_one_line_error(carol.run("%gpu offers"), "gpu: cannot reach the gpualloc service at http://127.0.0.1:9/: "
                                                    "check that it runs, or set GPUALLOC_URL")
    reloaded(GPUALLOC_URL=None)
    assert_one_line_error(carol.run("%gpu list"), "gpu: cannot find the gpualloc service: set GPUALLOC_URL")


def test_a_lease_applied_at_launch_and_framework_caps_on_import(service, start_kernel):
    """What the provisioner does: grant, start the kernel with the lease's env; then torch is imported."""
    holder = "kernel:launched-1"
    lease = service.call("POST", "leases", {"spec": {"kind": "shared", "memory_gib": 8, "model": "L4"},
                                            "holder": holder}, token=ALICE)
    env = slice_env(lease, gpu_memory_mib=23034)
    launched = start_kernel(GPUALLOC_HOLDER=holder, **env)
    status = launched.run("%gpu status")
    assert not status.stdout and not status.stderr, status
    text = status.displays[0]["text/plain"]
    assert f"lease {lease['id']}" in text and "(in effect in this kernel)" in text
    env_seen = json.loads(launched.run("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
                                       "('CUDA_VISIBLE_DEVICES', 'GPUALLOC_MEMORY_FRACTION')}))").stdout)
    assert env_seen == {"CUDA_VISIBLE_DEVICES": env["CUDA_VISIBLE_DEVICES"], "GPUALLOC_MEMORY_FRACTION": "0.3556"}
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: the cap applied on its import is not checked")
    probe = ("import json, torch\n"
             "from jupyter_gpualloc.kernel import _LOADED\n"
             "[gpu] = _LOADED.values()\n"
             "print(json.dumps({'applied': gpu.caps.applied, 'queued': [list(c.args) for c, _ in "
             "torch.cuda._queued_calls if getattr(c, 'func', None) is torch.cuda.set_per_process_memory_fraction]}))")
    report = json.loads(launched.run(probe, timeout=120).stdout)
    assert report == {"applied": {"torch": 0.3556}, "queued": [[0.3556, 0]]}
    assert "PyTorch (fraction 0.3556)" in launched.run("%gpu status").displays[0]["text/plain"]

    launched.run("%gpu release")
    granted = launched.run("%gpu request --shared 4GB --model L4")  # torch is imported, CUDA is not initialised
    assert "memory capped at 4 GiB, fraction 0.1778 of the GPU" in granted.stdout, granted
    report = json.loads(launched.run(probe).stdout)
    assert report == {"applied": {"torch": 0.1778}, "queued": [[0.3556, 0], [0.1778, 0]]}


def test_the_kernel_heartbeats_while_it_holds_a_lease(service, kernel):
    kernel.run("%gpu request 4GB")
    [lease] = mine(service, kernel)
    beat = lease["heartbeat_at"]
    kernel.run("from jupyter_gpualloc.kernel import _LOADED\n"
               "[gpu] = _LOADED.values(); gpu._not_holding(); gpu.heartbeat_interval = 0.2; gpu._holding()")
    time.sleep(1.0)
    [lease] = mine(service, kernel)
    assert lease["heartbeat_at"] > beat


def test_a_kernel_its_server_keeps_alive_sends_no_heartbeat_of_its_own(service, tmp_path):
    """Inside a server with the extension (which heartbeats every kernel it runs), %gpu request adds
    no second keeper: one heartbeat per process."""
    from jupyter_gpualloc.kernel.magics import KernelGpu

    environ = {"GPUALLOC_URL": service.url, "GPUALLOC_TOKEN": ALICE, "GPUALLOC_HOLDER": "kernel:kept"}
    alone = KernelGpu(environ=dict(environ), heartbeat_interval=0.1)
    kept = KernelGpu(environ={**environ, "GPUALLOC_HOLDER": "kernel:kept2", KEPT_ALIVE_VARIABLE: "1"},
                     heartbeat_interval=0.1)
    try:
        for gpu in (alone, kept):
            gpu.request({"kind": "shared", "memory_gib": 2, "model": "L4"})
        beats = {gpu.holder: gpu.client.lease(gpu.lease_id)["heartbeat_at"] for gpu in (alone, kept)}
        time.sleep(0.8)
        after = {gpu.holder: gpu.client.lease(gpu.lease_id)["heartbeat_at"] for gpu in (alone, kept)}
        assert after["kernel:kept"] > beats["kernel:kept"]
        assert after["kernel:kept2"] == beats["kernel:kept2"]
    finally:
        for gpu in (alone, kept):
            gpu.client.release(gpu.lease_id)
            gpu.close()


SLICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "GPUALLOC_LEASE_ID", "GPUALLOC_SLICE_KIND", "GPUALLOC_MEMORY_LIMIT_MIB",
                   "GPUALLOC_MEMORY_FRACTION", "CUDA_DEVICE_MEMORY_LIMIT", "CUPY_GPU_MEMORY_LIMIT")


def test_a_released_kernel_slice_gives_the_kernel_its_servers_slice_back(service, start_kernel):
    server = service.call("POST", "leases", {"spec": {"kind": "shared", "memory_gib": 8, "model": "L4"},
                                             "holder": "server"}, token=ALICE)
    server_env = slice_env(server, gpu_memory_mib=23034)  # what the spawner put in the server's env
    kernel = start_kernel(JUPYTERHUB_SERVER_NAME="", **server_env)
    status = kernel.run("%gpu status")
    assert status.stdout.strip() == (f"gpu: this kernel uses its server's shared 8 GiB on L4 (node0) (lease "
                                     f"{server['id']}); %gpu request 10GB asks for a slice of its own"), status
    assert env_of(kernel, *SLICE_VARIABLES) == {name: server_env.get(name) for name in SLICE_VARIABLES}

    kernel.run("%gpu request --mig 1g.5gb")
    [own] = mine(service, kernel)
    assert env_of(kernel, "CUDA_VISIBLE_DEVICES", "GPUALLOC_MEMORY_LIMIT_MIB") == {
        "CUDA_VISIBLE_DEVICES": own["slice"]["mig_uuid"], "GPUALLOC_MEMORY_LIMIT_MIB": None}
    released = kernel.run("%gpu release")
    assert released.stdout.strip() == (
        f"gpu: released MIG 1g.5gb on A100-SXM4-40GB (node0) (lease {own['id']}); this kernel uses its server's "
        f"shared 8 GiB on L4 (node0) again: CUDA_VISIBLE_DEVICES={server['slice']['gpu_uuids'][0]}"), released
    assert env_of(kernel, *SLICE_VARIABLES) == {name: server_env.get(name) for name in SLICE_VARIABLES}
    caps = kernel.run("from jupyter_gpualloc.kernel import _LOADED\n[gpu] = _LOADED.values(); print(gpu.caps.cap)")
    assert caps.stdout.strip() == "MemoryCap(limit_mib=8192, fraction=0.3556, device=0)"


def test_a_kernel_launched_with_its_own_slice_falls_back_to_its_named_servers(service, start_kernel):
    server = service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "server:lab"},
                          token=ALICE)
    holder = "kernel:launched-2"
    own = service.call("POST", "leases", {"spec": {"kind": "shared", "memory_gib": 4, "model": "L4"},
                                          "holder": holder}, token=ALICE)
    kernel = start_kernel(JUPYTERHUB_SERVER_NAME="lab", GPUALLOC_HOLDER=holder, **slice_env(own, gpu_memory_mib=23034))
    released = kernel.run("%gpu release")
    assert released.stdout.strip().endswith(f"this kernel uses its server's MIG 1g.5gb on A100-SXM4-40GB (node0) "
                                            f"again: CUDA_VISIBLE_DEVICES={server['slice']['mig_uuid']}"), released
    assert env_of(kernel, *SLICE_VARIABLES) == {name: slice_env(server).get(name) for name in SLICE_VARIABLES}


def test_list_columns_line_up_whatever_the_holders(service, kernel):
    kernel.run("%gpu request 4GB")
    long_holder = "server:" + "a-very-long-server-name-" * 4
    for holder in (long_holder, "job:1"):
        service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": holder}, token=ALICE)
    rows = kernel.run("%gpu list").stdout.splitlines()[1:]
    assert len(rows) == 3
    assert len({row.index(" granted ") for row in rows}) == 1, rows
    [cut] = [row for row in rows if "server:" in row]
    assert long_holder[:47] + "\u2026" in cut and long_holder not in cut


def test_no_gpu_output_or_help_shows_the_token(service, start_kernel):
    secret = "tok-that-must-stay-secret"
    kernel = start_kernel(token=secret)
    outputs = [kernel.run(line) for line in ("%gpu", "%gpu offers", "%gpu list", "%gpu request 4GB", "%gpu usage",
                                             "%gpu jobs", "%gpu extend", "%gpu request --model x", "%gpu nonsense")]
    outputs.append(kernel.run("print(get_ipython().find_line_magic('gpu').__doc__)"))
    text = "".join(cell.stdout + cell.stderr + json.dumps(cell.displays) for cell in outputs)
    assert "refused this kernel's token" in text and "--model MODEL" in text
    assert secret not in text
