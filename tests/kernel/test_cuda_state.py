from types import ModuleType, SimpleNamespace

import pytest

from jupyter_gpualloc.kernel import cuda_state
from jupyter_gpualloc.kernel.cuda_state import DRIVER_NAME, cuda_initialised_by, driver_loaded, register_detector


def fake_torch(initialised: bool) -> ModuleType:
    torch = ModuleType("torch")
    torch.cuda = SimpleNamespace(is_initialized=lambda: initialised)
    return torch


@pytest.fixture
def no_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n")
    return str(maps)


def test_nothing_imported_means_no_context(no_maps):
    assert cuda_initialised_by({}, no_maps) == []


def test_torch_reports_its_context(no_maps):
    assert cuda_initialised_by({"torch": fake_torch(True)}, no_maps) == ["torch"]
    assert cuda_initialised_by({"torch": fake_torch(False)}, no_maps) == []


def test_jax_backends(no_maps):
    bridge = ModuleType("jax._src.xla_bridge")
    bridge._backends = {"cpu": object()}
    assert cuda_initialised_by({"jax._src.xla_bridge": bridge}, no_maps) == []
    bridge._backends["cuda"] = object()
    assert cuda_initialised_by({"jax._src.xla_bridge": bridge}, no_maps) == ["jax"]


def test_a_detector_that_breaks_counts_as_initialised(no_maps):
    torch = ModuleType("torch")
    torch.cuda = SimpleNamespace()  # no is_initialized: the API moved
    assert cuda_initialised_by({"torch": torch}, no_maps) == ["torch"]


def test_the_driver_library_in_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15\n")
    assert driver_loaded(str(maps))
    assert cuda_initialised_by({}, str(maps)) == [DRIVER_NAME]
    assert not driver_loaded(str(tmp_path / "missing"))


def test_this_cpu_only_process_has_no_driver():
    assert not driver_loaded()


def test_registered_detectors(no_maps, monkeypatch):
    monkeypatch.setattr(cuda_state, "DETECTORS", dict(cuda_state.DETECTORS))
    register_detector("numba.cuda", "numba", lambda module: module.is_initialised)
    numba_cuda = SimpleNamespace(is_initialised=True)
    assert cuda_initialised_by({"numba.cuda": numba_cuda}, no_maps) == ["numba"]


def test_memory_is_not_measured_without_a_context():
    assert cuda_state.memory_used_mib() is None
