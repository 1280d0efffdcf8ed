"""Kernelspecs made from the offers, installed with jupyter_client's KernelSpecManager."""

from __future__ import annotations

import json
from pathlib import Path

from jupyter_client.kernelspec import KernelSpecManager

from jupyter_gpualloc.server.kernelspecs import install_kernelspecs, kernelspecs_for_offers

OFFERS = [
    {"name": "mig-1g.10gb-a100", "spec": {"kind": "mig", "profile": "1g.10gb", "model": "A100-SXM4-80GB"}},
    {"name": "mig-1g.10gb-h100", "spec": {"kind": "mig", "profile": "1g.10gb", "model": "H100"}, "idle_timeout": 600},
    {"name": "shared-8gb-l4", "spec": {"kind": "shared", "memory_gib": 8, "model": "L4"}},
    {"name": "whole-l4", "spec": {"kind": "whole", "model": "L4"}},
]


def test_display_names_name_the_model_only_where_two_offers_look_alike():
    specs = kernelspecs_for_offers(OFFERS)
    assert {n: s["display_name"] for n, s in specs.items()} == {
        "gpualloc-mig-1g.10gb-a100": "Python 3 (GPU 1g.10gb A100-SXM4-80GB)",
        "gpualloc-mig-1g.10gb-h100": "Python 3 (GPU 1g.10gb H100)",
        "gpualloc-shared-8gb-l4": "Python 3 (GPU 8 GiB shared)",
        "gpualloc-whole-l4": "Python 3 (GPU whole L4)",
    }
    stanza = specs["gpualloc-mig-1g.10gb-h100"]["metadata"]["kernel_provisioner"]
    # the kernel asks for its offer by name: the offer's idle timeout is the core's to give, never the kernelspec's
    assert stanza == {"provisioner_name": "gpualloc", "config": {
        "spec": OFFERS[1]["spec"], "offer": "mig-1g.10gb-h100"}}


def test_install_replaces_kernelspecs_no_longer_offered(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "user"))
    manager = KernelSpecManager(kernel_dirs=[str(tmp_path / "share" / "jupyter" / "kernels")])
    assert install_kernelspecs(OFFERS, prefix=str(tmp_path), manager=manager) == sorted(kernelspecs_for_offers(OFFERS))
    assert install_kernelspecs(OFFERS[2:], prefix=str(tmp_path), manager=manager) == [
        "gpualloc-shared-8gb-l4", "gpualloc-whole-l4"]
    found = manager.find_kernel_specs()
    assert sorted(n for n in found if n.startswith("gpualloc-")) == ["gpualloc-shared-8gb-l4", "gpualloc-whole-l4"]
    kernel_json = json.loads((Path(found["gpualloc-whole-l4"]) / "kernel.json").read_text())
    assert kernel_json["display_name"] == "Python 3 (GPU whole L4)"
