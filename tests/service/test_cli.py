"""`jupyter-gpualloc serve` as a command: help, configuration errors, the NVML default."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jupyter_gpualloc.service.app import main as serve_main
from tests.hubfixture import REPO_ROOT

from .conftest import FLEET


def serve(*args: str, cwd=None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jupyter_gpualloc.cli", "serve", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_help_all_lists_every_option():
    result = serve("--help-all")
    assert result.returncode == 0, result.stderr
    from jupyter_gpualloc.core.policy import SchedulerPolicy
    from jupyter_gpualloc.service.app import GpuAllocService

    for cls in (GpuAllocService, SchedulerPolicy):
        for name in cls.class_own_traits(config=True):
            assert f"--{cls.__name__}.{name}" in result.stdout, name
    assert "--HubOAuth.api_url" in result.stdout


def nvml_unavailable() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return True
    pynvml.nvmlShutdown()
    return False


@pytest.mark.skipif(not nvml_unavailable(), reason="this machine has a working NVIDIA driver")
def test_nvml_without_a_driver_is_one_line_and_exit_1(tmp_path):
    result = serve("--port", "0", "--db", f"sqlite:///{tmp_path / 'x.sqlite'}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("config,message", [
    ("c.GpuAllocService.api_tokens = {'short': {'user': 'a'}}", "at least 8 characters"),
    ("c.GpuAllocService.api_tokens = {'longenough': {'user': 'a', 'admn': True}}", "unknown key 'admn'"),
    ("c.GpuAllocService.backend = 'cloud'", "backend must be one of"),
    ("c.GpuAllocService.port = 'eighty'", "expected an int"),
    ("c.GpuAllocService.db_url = 'nonsense://x'", "nonsense"),
    ("c.SchedulerPolicy.quotas = {'bob': {'gpus': 1}}", "unknown key 'gpus'"),
])
def test_bad_configuration_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys, config, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpualloc_config.py").write_text(config + "\n")
    assert serve_main(["--fleet", str(FLEET)]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("args,message", [
    (["-f", "nope.py", "--fleet", str(FLEET)], "nope.py not found"),
    (["--backend", "simulated"], "needs a fleet file"),
    (["--fleet", "absent.yaml"], "absent.yaml"),
])
def test_missing_config_file_and_fleet(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert serve_main(args) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_example_config_loads_and_the_command_line_overrides_it(tmp_path):
    from jupyter_gpualloc.service.app import GpuAllocService

    example = REPO_ROOT / "examples" / "gpualloc_config.py"
    app = GpuAllocService()
    app.parse_command_line(["--port", "9999", "-f", str(example)])
    app.load_config_file(app.config_file)
    assert app.port == 9999 and app.max_wait == 60 and app.backend == "simulated"
    assert app.config.SchedulerPolicy.quotas["*"] == {"slices": 2, "memory_gib": 80}
    assert sum(1 for entry in app.api_tokens.values() if entry.get("admin")) == 1


def test_connections_count_as_activity_only_when_configured(fresh_service):
    import time

    from .conftest import ALICE, POLICY

    for counted in (False, True):
        service = fresh_service(config=POLICY + f"c.GpuAllocService.connections_are_activity = {counted}\n")
        service.start()
        lease = service.call("POST", "leases", {"spec": {"profile": "1g.5gb"}, "holder": "kernel:x"}, ALICE).json()
        time.sleep(0.2)
        touched = service.call("POST", f"leases/{lease['id']}/touch", {"connections": 2}, ALICE).json()
        assert (touched["last_activity"] > lease["last_activity"]) is counted
        service.kill()
