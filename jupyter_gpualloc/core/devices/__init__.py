"""Where GPUs come from: one interface (DeviceBackend), three sources, one factory."""

from __future__ import annotations

from typing import Any

from .base import (DeviceBackend, DeviceError, DevicePermissionError, DeviceUnavailable, GpuLost, GpuProcess,
                   GpuUtilization)
from .kubernetes import KubernetesBackend
from .nvml import NvmlBackend
from .simulated import SimulatedBackend, report_process_memory

BACKENDS = ("simulated", "nvml", "kubernetes")

__all__ = [
    "BACKENDS", "DeviceBackend", "DeviceError", "DevicePermissionError", "DeviceUnavailable", "GpuLost",
    "GpuProcess", "GpuUtilization", "KubernetesBackend", "NvmlBackend", "SimulatedBackend", "make_backend",
    "report_process_memory",
]


def make_backend(name: str, **options: Any) -> DeviceBackend:
    """A backend by name.

    - `simulated`: `fleet` (fleet file path, mapping or list of Nodes; required),
      `allow_mig_changes`, `process_dir`, `state_file` (keeps the MIG layout across restarts);
    - `nvml`: `node_name`;
    - `kubernetes`: `nodes` (Node objects, no cluster needed), or `label_selector`, `kubeconfig`,
      `timeout` to list the cluster's nodes.
    """
    if name == "simulated":
        if options.get("fleet") is None:
            raise ValueError("the simulated backend needs a fleet file: --fleet FLEET.yaml")
        fleet = options.pop("fleet")
        return SimulatedBackend(fleet, **options)
    if name == "nvml":
        return NvmlBackend(**options)
    if name == "kubernetes":
        if "nodes" in options:
            nodes = options.pop("nodes")
            if options:
                raise TypeError(f"unexpected options with nodes: {', '.join(sorted(options))}")
            return KubernetesBackend.from_node_objects(nodes)
        return KubernetesBackend.from_cluster(**options)
    raise ValueError(f"unknown device backend {name!r}: choose one of {', '.join(BACKENDS)}")
