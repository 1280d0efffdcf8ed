"""z2jh's NetworkPolicies and the pods the service makes (hub_config/z2jh-values.yaml,
hub_config/gpualloc-netpol.yaml): the API server accepts the policy, and its selectors, as the API
server evaluates them, pick the pods they are meant to: z2jh's singleuser policy fences in a kernel
pod as its server, the server's egress rule reaches the kernel pod, and the kernel pod lets in the
release's servers. (The control plane enforces no NetworkPolicy: there is no CNI plugin here.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from jupyter_gpualloc.kube.gpu import KubeGpu
from jupyter_gpualloc.service.kernel_pods import KERNEL_LABEL
from jupyter_gpualloc.service.user_pods import UserPods, pod_template

from .test_cluster import gpu_pod

client = pytest.importorskip("kubernetes_asyncio.client")

HUB_CONFIG = Path(__file__).parents[2] / "hub_config"
Z2JH_LABELS = {"component": "singleuser-server", "app": "jupyterhub", "release": "jhub"}  # jupyterhub.matchLabels


def selector(podselector: dict) -> str:
    """A NetworkPolicy's podSelector as a label selector string, for the API server to evaluate."""
    terms = [f"{k}={v}" for k, v in (podselector.get("matchLabels") or {}).items()]
    for expression in podselector.get("matchExpressions") or []:
        assert expression["operator"] == "Exists", expression
        terms.append(expression["key"])
    return ",".join(terms)


def test_the_policies_select_kernel_pods_as_meant(k8s_cluster, namespace):
    server = gpu_pod("jupyter-alice", {}, labels={**Z2JH_LABELS, "hub.jupyter.org/username": "alice"})
    server["metadata"]["namespace"] = namespace
    kernel_labels = UserPods(KubeGpu(), lambda node: None).labels(pod_template(server), "kernel", **{KERNEL_LABEL: "k1"})
    kernel = gpu_pod("kernel-k1", {}, labels=kernel_labels)
    values = yaml.safe_load((HUB_CONFIG / "z2jh-values.yaml").read_text())
    egress = values["singleuser"]["networkPolicy"]["egress"]
    [to_kernels] = [rule for rule in egress if any(p.get("endPort") for p in rule["ports"])]
    [policy] = yaml.safe_load_all((HUB_CONFIG / "gpualloc-netpol.yaml").read_text())

    async def body(api):
        core = client.CoreV1Api(api)
        for pod in (server, kernel):
            await core.create_namespaced_pod(namespace, pod)
        await client.NetworkingV1Api(api).create_namespaced_network_policy(namespace, policy)

        async def names(podselector: dict) -> set[str]:
            pods = await core.list_namespaced_pod(namespace, label_selector=selector(podselector))
            return {p.metadata.name for p in pods.items}

        assert await names({"matchLabels": Z2JH_LABELS}) == {"jupyter-alice", "kernel-k1"}  # z2jh's singleuser policy
        assert await names(to_kernels["to"][0]["podSelector"]) == {"kernel-k1"}  # a server's egress to its kernels
        assert await names(policy["spec"]["podSelector"]) == {"kernel-k1"}  # the kernel pods' ingress policy
        assert await names(policy["spec"]["ingress"][0]["from"][0]["podSelector"]) >= {"jupyter-alice"}

    k8s_cluster.run(body)
    assert to_kernels["ports"] == policy["spec"]["ingress"][0]["ports"]
