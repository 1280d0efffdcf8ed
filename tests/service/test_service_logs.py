"""The service's log: what its modules log (the reconciler's pod deletions, the pods and Jobs the
service makes) goes out through `serve`'s own handler at its log level, not only the application's."""

from __future__ import annotations

import logging

import pytest

from jupyter_gpualloc.service.app import GpuAllocService

from .conftest import FLEET


@pytest.fixture
def serve(tmp_path):
    """`jupyter-gpualloc serve`'s application, configured from its command line, not started."""
    made = []

    def make(*args: str) -> GpuAllocService:
        app = GpuAllocService()
        app.initialize(["--fleet", str(FLEET), "--db", f"sqlite:///{tmp_path / 'gpualloc.sqlite'}",
                        "--audit-log", str(tmp_path / "audit.jsonl"), *args])
        made.append(app)
        return app

    yield make
    for app in made:
        app.core.close()
        app.broker.close()
    logging.getLogger("jupyter_gpualloc").parent = logging.getLogger()


def test_module_info_lines_reach_the_services_log(serve, capsys):
    serve()
    logging.getLogger("jupyter_gpualloc.service.cluster").info("deleting pod %s of lease %s: %s",
                                                               "ns/kernel-1", "abc", "its lease ended")
    logging.getLogger("jupyter_gpualloc.service.job_pods").debug("not at INFO")
    err = capsys.readouterr().err
    assert "jupyter_gpualloc.service.cluster] deleting pod ns/kernel-1 of lease abc: its lease ended" in err
    assert "not at INFO" not in err


def test_the_modules_follow_the_log_level(serve, capsys):
    serve("--log-level", "WARN")
    logging.getLogger("jupyter_gpualloc.service.job_pods").info("Kubernetes Job made")
    logging.getLogger("jupyter_gpualloc.service.job_pods").warning("creating its Kubernetes Job failed")
    err = capsys.readouterr().err
    assert "Kubernetes Job made" not in err and "creating its Kubernetes Job failed" in err
