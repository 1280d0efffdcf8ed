"""NvmlBackend against pynvml's real functions, with the C library replaced by a fake."""

from __future__ import annotations

import json
import logging
import re

import pynvml
import pytest

from jupyter_gpualloc.core import mig
from jupyter_gpualloc.core.devices.base import DeviceError, DevicePermissionError, DeviceUnavailable, GpuLost
from jupyter_gpualloc.core.devices.nvml import LIBRARY_NOT_FOUND, NvmlBackend
from jupyter_gpualloc.core.model import MigMode

from .fake_nvml import MIB, FakeGpu, FakeNvml, a30_profiles, gpu_host, install

A100 = "GPU-0a100000-1111-2222-3333-444444444444"
L4 = "GPU-0b140000-5555-6666-7777-888888888888"


@pytest.fixture
def fake(monkeypatch):
    return install(monkeypatch, gpu_host())


@pytest.fixture
def backend(fake):
    b = NvmlBackend(node_name="gpu-host")
    yield b
    b.close()


def test_enumerates_gpus_mig_mode_and_instances(backend, fake):
    [node] = backend.discover()
    assert node.name == "gpu-host" and node.cpu_milli >= 1000 and node.memory_mib > 0
    a100, l4 = node.gpus
    assert (a100.uuid, a100.model, a100.memory_mib, a100.index) == (A100, "A100-SXM4-40GB", 40960, 0)
    assert a100.mig_capable and a100.mig_mode is MigMode.DYNAMIC
    assert [(i.profile_id, i.start, i.size, i.gi_id, i.ci_id) for i in a100.instances] == [
        (14, 0, 2, 3, 0), (19, 2, 1, 9, -1), (9, 4, 4, 2, 0)]
    created = {gi.gi_id: gi.compute_instances[0] for gi in fake.gpus[0].instances if gi.compute_instances}
    assert a100.instances[0].uuid == created[3] and a100.instances[2].uuid == created[2]
    assert re.fullmatch(r"MIG-[0-9a-f-]{36}", a100.instances[0].uuid)
    assert a100.instances[1].uuid == ""  # a GPU instance without compute instance has no MIG device
    assert (l4.model, l4.memory_mib, l4.mig_capable, l4.mig_mode, l4.instances) == (
        "L4", 23034, False, MigMode.OFF, [])


def test_profiles_are_read_from_the_driver(backend):
    profiles = backend.mig_profiles(A100)
    assert sorted(profiles) == [0, 5, 9, 14, 15, 19, 20]
    one = profiles[19]
    assert (one.name, one.compute_slices, one.memory_slices, one.memory_mib, one.max_instances, one.sms) == (
        "1g.5gb", 1, 1, 4864, 7, 14)
    assert one.starts == (0, 1, 2, 3, 4, 5, 6)
    assert profiles[15].starts == (0, 2, 4, 6) and profiles[15].memory_slices == 2
    assert profiles[20].media_extensions and profiles[20].name == "1g.5gb+me"
    assert profiles[0].name == "7g.40gb" and profiles[0].memory_slices == 8
    assert backend.mig_profiles(L4) == {}
    [node] = backend.discover()
    assert mig.is_legal(node.gpus[0].instances, profiles)


def test_mig_queries_are_not_supported_on_the_l4(backend, fake):
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByUUID(L4))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceProfileInfo(pynvml.nvmlDeviceGetHandleByUUID(L4), 0)
    fake.calls.clear()
    backend.discover()
    starts = [n for n, call in enumerate(fake.calls) if call == "nvmlDeviceGetHandleByIndex_v2"]
    l4_calls = fake.calls[starts[1]:]
    assert "nvmlDeviceGetMigMode" in l4_calls
    assert "nvmlDeviceGetGpuInstanceProfileInfoV" not in l4_calls


def test_create_and_destroy(backend, fake):
    created = backend.create_mig_instance(A100, 19, 3)  # slice 3 is the only free one
    assert (created.profile_id, created.start, created.size, created.gi_id, created.ci_id) == (19, 3, 1, 1, 0)
    assert created.uuid.startswith("MIG-")
    gi = next(g for g in fake.gpus[0].instances if g.gi_id == 1)
    assert (gi.profile.id, gi.start, gi.compute_instances) == (19, 3, {0: created.uuid})
    assert any(i.uuid == created.uuid for i in backend.discover()[0].gpus[0].instances)

    backend.destroy_mig_instance(A100, created.uuid)
    assert all(g.gi_id != 1 for g in fake.gpus[0].instances)
    again = backend.create_mig_instance(A100, 19, 3)
    assert again.uuid != created.uuid  # the driver gives a re-created instance a new UUID


def test_create_overlapping_placement_is_refused(backend, fake):
    with pytest.raises(DeviceError, match="insufficient resources") as err:
        backend.create_mig_instance(A100, 19, 4)  # inside the 3g.20gb at 4
    assert not isinstance(err.value, DevicePermissionError)
    assert backend.can_change_mig
    with pytest.raises(DeviceError, match="no MIG profile id 99"):
        backend.create_mig_instance(A100, 99, 0)
    with pytest.raises(DeviceError, match="no MIG profile id 19"):
        backend.create_mig_instance(L4, 19, 0)


def test_destroy_in_use_and_unknown(backend, fake):
    busy = backend.discover()[0].gpus[0].instances[0]  # 2g.10gb with a running process
    with pytest.raises(DeviceError, match="in use"):
        backend.destroy_mig_instance(A100, busy.uuid)
    with pytest.raises(DeviceError, match="has no MIG instance MIG-nope"):
        backend.destroy_mig_instance(A100, "MIG-nope")
    with pytest.raises(DeviceError, match="no GPU GPU-missing"):
        backend.destroy_mig_instance("GPU-missing", busy.uuid)


def test_no_permission_makes_mig_static(backend, fake):
    fake.errors["nvmlDeviceCreateGpuInstanceWithPlacement"] = pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(DevicePermissionError, match="insufficient permissions.*MIG is static from now on"):
        backend.create_mig_instance(A100, 19, 3)
    assert not backend.can_change_mig
    assert backend.discover()[0].gpus[0].mig_mode is MigMode.STATIC
    fake.errors.clear()
    calls = len(fake.calls)
    with pytest.raises(DevicePermissionError, match="MIG is static here"):
        backend.create_mig_instance(A100, 19, 3)
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in fake.calls[calls:]


def test_failed_compute_instance_rolls_back_the_gpu_instance(backend, fake):
    fake.errors["nvmlGpuInstanceCreateComputeInstance"] = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    before = [g.gi_id for g in fake.gpus[0].instances]
    with pytest.raises(DeviceError, match="insufficient resources"):
        backend.create_mig_instance(A100, 19, 3)
    assert [g.gi_id for g in fake.gpus[0].instances] == before


def test_gpu_lost(backend, fake):
    fake.gpus[0].lost = True
    with pytest.raises(GpuLost, match=r"GPU index 0 is lost \(it fell off the bus or stopped answering\)"):
        backend.discover()
    with pytest.raises(GpuLost, match=rf"GPU {A100} is lost .* trying to read the MIG mode.*needs a reset"):
        backend.create_mig_instance(A100, 19, 3)
    with pytest.raises(GpuLost):
        backend.process_memory()


def test_process_memory_per_gpu_and_mig_device(backend, fake):
    processes = backend.process_memory()
    mig_uuid = fake.gpus[0].instances[0].compute_instances[0]
    assert sorted((p.pid, p.gpu_uuid, p.used_mib, p.mig_uuid) for p in processes) == [
        (4242, A100, 1536, mig_uuid), (5151, L4, 2048, None), (5252, L4, None, None)]


def test_describe_is_json(backend, fake):
    report = json.loads(json.dumps(backend.describe()))
    assert report["driver_version"] == "550.54.15" and report["cuda_driver_version"] == 12040
    a100, l4 = report["gpus"]
    assert a100["mig_mode"] == {"current": 1, "pending": 1} and l4["mig_mode"] is None
    assert {p["name"] for p in a100["mig_profiles"]} >= {"1g.5gb", "3g.20gb", "7g.40gb"}
    assert len(a100["mig_instances"]) == 3 and l4["mig_profiles"] == []
    assert a100["memory_mib"]["used"] == 1536 and l4["memory_mib"]["total"] == 23034
    assert [p["pid"] for p in l4["processes"]] == [5151, 5252]


def test_library_not_found_is_one_clear_message(monkeypatch):
    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    with pytest.raises(DeviceUnavailable) as err:
        NvmlBackend()
    assert str(err.value) == LIBRARY_NOT_FOUND
    assert "libnvidia-ml.so.1" in str(err.value) and "--backend" not in str(err.value)  # each caller says how to simulate
    assert "\n" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_driver_not_loaded(monkeypatch, fake):
    fake.errors["nvmlInitWithFlags"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    monkeypatch.setattr(pynvml, "nvmlLib", fake.lib)
    with pytest.raises(DeviceUnavailable, match="driver is not loaded$"):
        NvmlBackend()


def test_process_memory_counts_bytes_as_mib(backend, fake):
    fake.gpus[1].processes = [(7, 100 * MIB + 5)]
    assert [(p.pid, p.used_mib) for p in backend.process_memory() if p.gpu_uuid == L4] == [(7, 100)]


def test_the_driver_wins_over_the_catalogue_and_the_difference_is_logged(monkeypatch, caplog):
    host = gpu_host()
    one = next(p for p in host.gpus[0].profiles if p.id == 19)
    one.memory_mb = 5120  # a driver that gives 1g.5gb 5.00 GiB, not the 4.75 the catalogue knows
    install(monkeypatch, host)
    backend = NvmlBackend(node_name="gpu-host")
    with caplog.at_level(logging.WARNING, logger="jupyter_gpualloc.core.devices.nvml"):
        profiles = backend.mig_profiles(A100)
    assert profiles[19].memory_mib == 5120
    assert mig.lookup_model("A100-SXM4-40GB").profiles[19].memory_mib == 4864
    [warning] = [r.getMessage() for r in caplog.records]
    assert "memory_mib is 5120 on the driver, 4864 in the catalogue" in warning and A100 in warning
    report = backend.describe()
    assert report["gpus"][0]["catalogue_differences"] == [warning.split("catalogue: ", 1)[1]]
    assert report["gpus"][1]["catalogue_differences"] == []


def test_a_driver_that_agrees_with_the_catalogue_logs_nothing(backend, caplog):
    with caplog.at_level(logging.WARNING, logger="jupyter_gpualloc.core.devices.nvml"):
        backend.mig_profiles(A100)
    assert caplog.records == []


def test_an_a30_reads_its_own_geometry_from_the_driver(monkeypatch):
    a30 = FakeGpu(name="NVIDIA A30", uuid="GPU-0a300000-1111-2222-3333-444444444444", memory_mib=24576,
                  profiles=a30_profiles(), mig_enabled=True)
    install(monkeypatch, FakeNvml([a30]))
    backend = NvmlBackend(node_name="a30-host")
    profiles = backend.mig_profiles(a30.uuid)
    assert {pid: p.name for pid, p in profiles.items()} == {
        14: "1g.6gb", 21: "1g.6gb+me", 5: "2g.12gb", 6: "2g.12gb+me", 0: "4g.24gb"}
    assert mig.MigGeometry.of(profiles) == mig.MigGeometry(memory_slices=4, compute_slices=4)
    assert profiles[5].memory_mib == 11904  # the driver's size, not the catalogue's
    backend.create_mig_instance(a30.uuid, 5, 2)
    backend.create_mig_instance(a30.uuid, 14, 0)
    with pytest.raises(DeviceError, match="insufficient resources"):
        backend.create_mig_instance(a30.uuid, 5, 0)
    [node] = backend.discover()
    layout = mig.Layout.of(node.gpus[0].instances, profiles)
    assert mig.legal_starts(layout, profiles[14]) == [1] and layout.free_compute_slices == 1


def test_process_utilization_reads_only_samples_newer_than_the_last_read(backend, fake):
    l4 = fake.gpus[1]
    l4.utilization_samples = [(5151, 1_000, 80), (5151, 2_000, 60), (5252, 2_000, 0)]
    [sample] = backend.utilization(now=0.0)  # the A100 has MIG and no GPM: it is left out
    assert (sample.gpu_uuid, sample.mig_uuid, sample.sm_percent) == (L4, None, None)
    assert sample.processes == {5151: 70.0, 5252: 0.0}
    l4.utilization_samples.append((5151, 3_000, 10))
    assert backend.utilization(now=5.0)[0].processes == {5151: 10.0}
    # NOT_FOUND: nothing ran on the GPU since: sampled, and every process idle
    assert backend.utilization(now=10.0)[0].processes == {}


def test_process_utilization_not_supported_falls_back_to_the_device_rate(backend, fake):
    fake.gpus[1].process_utilization = False
    fake.gpus[1].gpu_percent = 45
    [sample] = backend.utilization(now=0.0)
    assert (sample.gpu_uuid, sample.sm_percent, sample.processes) == (L4, 45.0, None)
    fake.errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert backend.utilization(now=1.0) == []  # nothing to sample: idleness is left to activity


def test_success_without_samples_is_no_process_busy(backend, fake):
    fake.errors["nvmlDeviceGetProcessUtilization"] = pynvml.NVML_SUCCESS  # count 0, as some drivers answer
    assert backend.utilization(now=0.0)[0].processes == {}


def test_mig_instances_are_sampled_through_gpm_from_the_second_call(backend, fake):
    a100 = fake.gpus[0]
    a100.gpm = True
    two_g, three_g = (gi for gi in a100.instances if gi.compute_instances)
    two_g.sm_percent, three_g.sm_percent = 55.0, 0.0
    assert [s.gpu_uuid for s in backend.utilization(now=0.0)] == [L4]  # no samples yet on the A100
    samples = {s.mig_uuid: s for s in backend.utilization(now=5.0) if s.gpu_uuid == A100}
    assert {m: (s.sm_percent, s.processes) for m, s in samples.items()} == {
        two_g.compute_instances[0]: (55.0, None), three_g.compute_instances[0]: (0.0, None)}
    assert len(fake.gpm_samples) == 2  # one kept per MIG instance, the previous ones freed
    backend.destroy_mig_instance(A100, three_g.compute_instances[0])
    assert [s.mig_uuid for s in backend.utilization(now=10.0) if s.gpu_uuid == A100] == [
        two_g.compute_instances[0]]
    assert len(fake.gpm_samples) == 1  # the destroyed instance's sample is freed
    backend.close()
    assert fake.gpm_samples == {}


def test_mig_without_gpm_is_not_sampled(backend, fake):
    fake.errors["nvmlGpmQueryDeviceSupport"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND  # an older driver
    assert [s.gpu_uuid for s in backend.utilization(now=0.0)] == [L4]
    assert "nvmlGpmMigSampleGet" not in fake.calls and "nvmlDeviceGetProcessUtilization" in fake.calls


def test_utilization_of_a_lost_gpu(backend, fake):
    fake.gpus[1].lost = True
    with pytest.raises(GpuLost, match=r"GPU index 1 is lost .*needs a reset"):
        backend.utilization(now=0.0)
