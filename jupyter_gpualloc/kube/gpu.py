"""How this cluster's pods get their GPU slice: one Configurable, `c.KubeGpu`, for the spawner's
server pods (hub/kube.py) and the service's kernel and job pods (service/user_pods.py).

The extended resources a pod asks for are named by the lease's node, as its device plugin
advertises them (`NodeResources`, read by the kubernetes backend): `nvidia.com/mig-<profile>` on a
node with the `mixed` MIG strategy, `nvidia.com/gpu` for a MIG device on a `single` one, and
`nvidia.com/gpu` or the renamed `nvidia.com/gpu.shared` for whole GPUs and time-sliced or MPS
replicas. The service, which reads the nodes, names them in each granted lease (`pod.resources`),
and the spawner asks for those; what is configured here is what a node does not say.
"""

from __future__ import annotations

from typing import Any, Mapping

from traitlets import Dict, List, Unicode
from traitlets.config import Configurable

from ..core.devices.kubernetes import NodeResources, node_affinity, resource_limits


class KubeGpu(Configurable):
    """How pods holding a GPU slice are made on this cluster (see the module). Set it alike in the
    hub's config (server pods) and the service's (kernel and job pods, and the taints it judges)."""

    shared_resources = Dict(
        {"nvidia.com/gpu.shared": "1"},
        help="""Extended resources a pod asks for with a shared slice; values are templates with
        {memory_mib}, {memory_gib}, {percent} and {milli}, and a key naming the device plugin's GPU
        resource (nvidia.com/gpu or nvidia.com/gpu.shared) becomes the one the lease's node advertises,
        so the default asks one time-sliced or MPS replica, renamed or not. HAMi: {"nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "{memory_mib}"}; empty: only the memory-cap env applies.""",
    ).tag(config=True)
    node_label = Unicode(
        "kubernetes.io/hostname", help="Node label whose value is the lease's node name (required node affinity).",
    ).tag(config=True)
    tolerations = List(
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        help="""Tolerations added to every pod holding a GPU slice (GPU nodes are often tainted): server
        pods, and the service's kernel and job pods. The service counts on them: a node with a NoSchedule
        or NoExecute taint none of them tolerates is drained (its GPUs are not offered or granted;
        /inventory says which taint), as such pods would stay Pending there.""",
    ).tag(config=True)

    def limits(self, slice_: Mapping[str, Any], node: NodeResources | None) -> dict[str, str]:
        """The extended resources for `slice_` on its node, advertised as `node` says (None: unknown)."""
        return resource_limits(slice_, node, shared_resources=self.shared_resources)

    def node_term(self, node: str) -> dict[str, Any]:
        """The NodeSelectorTerm pinning a pod to node `node`."""
        return node_affinity(node, self.node_label)
