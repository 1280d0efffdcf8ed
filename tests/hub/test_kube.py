"""GPUKubeSpawner pods, built by KubeSpawner's own get_pod_manifest() and checked against the
Kubernetes API schemas offline (kubernetes-validate); no cluster is needed."""

from __future__ import annotations

import asyncio

import kubernetes_validate
import pytest
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import kube_config
from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpualloc.core.model import Lease, LeaseState, PriorityClass, Slice, SliceKind, SliceSpec
from jupyter_gpualloc.hub.kube import GPUKubeSpawner, offers_profile_list, resource_limits

K8S_VERSION = "1.30.0"
SERVICE = "http://proxy-public/services/gpualloc/"
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: offline, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: offline, user: {token: offline}}]
contexts: [{name: offline, context: {cluster: offline, user: offline, namespace: jhub}}]
current-context: offline
"""

SLICES = {
    "mig": Slice(SliceKind.MIG, "gpu-node-1", ("GPU-a",), 40192, profile="3g.40gb", start=4,
                 mig_uuid="MIG-b", model="A100-SXM4-80GB"),
    "shared": Slice(SliceKind.SHARED, "gpu-node-2", ("GPU-c",), 8192, milli=101, model="H100 80GB HBM3"),
    "whole": Slice(SliceKind.WHOLE, "gpu-node-3", ("GPU-d", "GPU-e"), 23034, model="L4"),
}


def lease_json(kind: str) -> dict:
    sl = SLICES[kind]
    return Lease(id=f"lease-{kind}", user="alice", holder="server", spec=SliceSpec(kind=sl.kind),
                 priority=PriorityClass.INTERACTIVE, state=LeaseState.GRANTED, created_at=0.0, seq=1,
                 slice=sl).to_json()


@pytest.fixture(autouse=True)
def offline_kubeconfig(tmp_path, monkeypatch):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(path))
    # kubernetes_asyncio reads $KUBECONFIG once, at import
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))


def make_spawner(**settings) -> GPUKubeSpawner:
    c = Config()
    c.GPUKubeSpawner.gpualloc_url = SERVICE
    for name, value in settings.items():
        setattr(c.GPUKubeSpawner, name, value)
    return GPUKubeSpawner(config=c, _mock=True)


def pod_for(kind: str | None, **settings) -> dict:
    async def build():
        spawner = make_spawner(**settings)
        spawner._gpu_init()
        spawner._gpu_lease = lease_json(kind) if kind else None
        spawner._gpu_memory = 81559 if kind == "shared" else None
        pod = await spawner.get_pod_manifest()
        assert spawner.extra_resource_limits == settings.get("extra_resource_limits", {})
        return ApiClient().sanitize_for_serialization(pod)

    pod = asyncio.run(build())
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    return pod


def container_env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def affinity_nodes(pod: dict) -> list[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [v for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"] for v in e["values"]]


def test_mig_pod_asks_for_the_profile_on_the_lease_node():
    pod = pod_for("mig")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/mig-3g.40gb"] == "1"
    assert affinity_nodes(pod) == ["gpu-node-1"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
    env = container_env(pod)
    assert env["GPUALLOC_LEASE_ID"] == "lease-mig" and env["GPUALLOC_URL"] == SERVICE
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin assigns the device


def test_mig_single_strategy_and_device_env():
    pod = pod_for("mig", gpu_mig_strategy="single", gpu_device_env=True)
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = container_env(pod)
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "MIG-b"


def test_shared_pod_gets_sharing_resources_and_memory_caps():
    pod = pod_for("shared")
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    assert affinity_nodes(pod) == ["gpu-node-2"]
    env = container_env(pod)
    assert env["GPUALLOC_MEMORY_LIMIT_MIB"] == "8192"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "8192m"
    assert env["CUPY_GPU_MEMORY_LIMIT"] == str(8192 * 1024 * 1024)
    assert abs(float(env["GPUALLOC_MEMORY_FRACTION"]) - 8192 / 81559) < 1e-4


def test_shared_pod_with_hami_resource_names():
    pod = pod_for("shared", gpu_shared_resources={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "{memory_mib}",
                                                  "nvidia.com/gpucores": "{percent}"})
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1" and limits["nvidia.com/gpumem"] == "8192"
    assert limits["nvidia.com/gpucores"] == "11"


def test_whole_gpus_pod_and_admin_settings_are_kept():
    pod = pod_for("whole", extra_resource_limits={"example.com/fpga": "1"},
                  tolerations={"spot": {"key": "spot", "operator": "Exists"}})
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "2" and limits["example.com/fpga"] == "1"
    assert {"key": "spot", "operator": "Exists"} in pod["spec"]["tolerations"]
    assert affinity_nodes(pod) == ["gpu-node-3"]


def test_no_gpu_pod_hides_devices():
    pod = pod_for(None)
    limits = (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
    assert not any(name.startswith("nvidia.com/") for name in limits)
    assert "affinity" not in pod["spec"] or not pod["spec"]["affinity"]
    assert container_env(pod)["GPUALLOC_URL"] == SERVICE


async def constructed(**settings) -> GPUKubeSpawner:
    return make_spawner(**settings)


def test_invalid_mig_strategy_is_refused():
    with pytest.raises(TraitError, match="mixed"):
        asyncio.run(constructed(gpu_mig_strategy="double"))


def test_resource_limits_templates():
    shared = SLICES["shared"].to_json()
    assert resource_limits(shared, shared_resources={"x/mem": "{memory_gib}Gi", "x/milli": "{milli}"}) == {
        "x/mem": "8Gi", "x/milli": "101"}
    assert resource_limits(shared, shared_resources={}) == {}


def test_offers_become_profile_list_entries():
    offers = [{"name": "none", "label": "No GPU", "spec": None, "available": None},
              {"name": "mig-1g.10gb", "label": "MIG 1g.10gb", "spec": {"kind": "mig"}, "available": 0}]
    entries = offers_profile_list(offers, selected="mig-1g.10gb")
    assert [e["slug"] for e in entries] == ["none", "mig-1g.10gb"]
    assert [e["default"] for e in entries] == [False, True]
    assert entries[1]["description"] == "none free now: you will wait in the queue"
    spawner = asyncio.run(constructed(gpu_profile_list=True))
    assert spawner.gpu_option_keys() == ("profile", ("profile-option-",))
    assert spawner.options_from_form({"profile": ["mig-1g.10gb"]}) == {"profile": "mig-1g.10gb"}


def test_z2jh_values_configure_a_working_gpu_kube_spawner():
    from importlib import import_module
    from pathlib import Path

    import yaml

    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "hub_config" / "z2jh-values.yaml").read_text())
    hub = values["hub"]
    module, _, name = hub["config"]["JupyterHub"]["spawner_class"].rpartition(".")
    assert getattr(import_module(module), name) is GPUKubeSpawner
    settings = hub["config"]["GPUKubeSpawner"]
    assert set(settings) <= set(GPUKubeSpawner.class_trait_names(config=True))
    assert "gpualloc" in hub["services"] and settings["gpualloc_url"].endswith("/services/gpualloc/")
    access = "access:services!service=gpualloc"
    assert access in hub["loadRoles"]["user"]["scopes"] and access in hub["loadRoles"]["server"]["scopes"]
    assert "custom:gpualloc:admin" in hub["config"]["JupyterHub"]["custom_scopes"]
    pod = pod_for("mig", **{k: v for k, v in settings.items() if k not in ("gpualloc_url",)})
    assert container_env(pod)["GPUALLOC_URL"] == settings["gpualloc_server_url"]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"
