"""GPUKubeSpawner pods, built by KubeSpawner's own get_pod_manifest() and checked against the
Kubernetes API schemas offline (kubernetes-validate); no cluster is needed."""

from __future__ import annotations

import asyncio

import kubernetes_validate
import pytest
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import kube_config
from jupyterhub.spawner import SpawnException
from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpualloc.core.model import Lease, LeaseState, PriorityClass, Slice, SliceKind, SliceSpec
from jupyter_gpualloc.core.devices.kubernetes import NodeResources, resource_limits
from jupyter_gpualloc.hub.kube import GPUKubeSpawner
from jupyter_gpualloc.kube.gpu import KubeGpu

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


def make_spawner(service: str | None = SERVICE, kube_gpu: dict | None = None, **settings) -> GPUKubeSpawner:
    c = Config()
    if service:
        c.GPUKubeSpawner.gpualloc_url = service
    for name, value in settings.items():
        setattr(c.GPUKubeSpawner, name, value)
    for name, value in (kube_gpu or {}).items():
        setattr(c.KubeGpu, name, value)
    return GPUKubeSpawner(config=c, _mock=True)


def validated(pod: dict) -> dict:
    """A pod (as KubeSpawner's serialized manifest) checked against the Kubernetes schemas."""
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    return pod


def pod_for(kind: str | None, service: str | None = SERVICE, owned: dict | None = None, kube_gpu: dict | None = None,
            **settings) -> dict:
    """The pod for a lease of `kind`, the service's `pod` (namespace, labels, resources) in the lease when `owned`."""
    async def build():
        spawner = make_spawner(service, kube_gpu, **settings)
        if kind:
            spawner.gpu_lease.adopt({**lease_json(kind), **({"pod": owned} if owned else {})})
        spawner._gpu_memory = 81559 if kind == "shared" else None
        pod = await spawner.get_pod_manifest()
        assert spawner.extra_resource_limits == settings.get("extra_resource_limits", {})
        return ApiClient().sanitize_for_serialization(pod)

    return validated(asyncio.run(build()))


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


def test_the_pod_carries_the_labels_the_service_names_for_its_lease():
    owned = {"namespace": "default", "labels": {"gpualloc.jupyter.org/lease": "lease-mig",
                                                "gpualloc.jupyter.org/instance": "staging"}}
    labels = pod_for("mig", owned=owned)["metadata"]["labels"]
    assert labels["gpualloc.jupyter.org/lease"] == "lease-mig" and labels["gpualloc.jupyter.org/instance"] == "staging"


def test_a_pod_the_service_would_not_own_is_not_made():
    owned = {"namespace": "gpualloc", "labels": {"gpualloc.jupyter.org/lease": "lease-mig"}}
    with pytest.raises(SpawnException) as refused:
        pod_for("mig", owned=owned)  # KubeSpawner's namespace here: default
    assert "namespace gpualloc" in str(refused.value.jupyterhub_message)
    assert "c.GpuAllocService.namespace" in refused.value.jupyterhub_message


def test_the_pod_asks_for_the_resources_the_service_names_and_names_no_device():
    owned = {"namespace": "default", "labels": {"gpualloc.jupyter.org/lease": "lease-mig"},
             "resources": {"nvidia.com/gpu": "1"}}  # a MIG device on a node of the single strategy
    pod = pod_for("mig", owned=owned)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1" and not [r for r in limits if r.startswith("nvidia.com/mig-")], limits
    env = container_env(pod)
    assert "CUDA_VISIBLE_DEVICES" not in env and "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin's


def test_naming_the_devices_in_the_env_is_refused_at_config_time():
    """The allocator's UUIDs on Kubernetes are not the driver's: an env naming them would hide every GPU."""
    with pytest.raises(TraitError, match="gpu_device_env = True cannot work"):
        make_spawner(gpu_device_env=True)


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
    pod = pod_for("shared", kube_gpu={"shared_resources": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "{memory_mib}",
                                                           "nvidia.com/gpucores": "{percent}"}})
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
    env = container_env(pod)
    assert env["GPUALLOC_URL"] == SERVICE
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["CUDA_VISIBLE_DEVICES"] == ""
    shown = container_env(pod_for(None, gpu_hide_devices_without_slice=False))
    assert "NVIDIA_VISIBLE_DEVICES" not in shown and "CUDA_VISIBLE_DEVICES" not in shown


def test_pods_and_env_need_no_service():
    env = container_env(pod_for(None, service=None))
    assert not any(name.startswith("GPUALLOC_") for name in env)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert container_env(pod_for("mig", service=None))["GPUALLOC_LEASE_ID"] == "lease-mig"


def test_resource_limits_templates():
    shared = SLICES["shared"].to_json()
    assert resource_limits(shared, shared_resources={"x/mem": "{memory_gib}Gi", "x/milli": "{milli}"}) == {
        "x/mem": "8Gi", "x/milli": "101"}
    assert resource_limits(shared, shared_resources={}) == {}


def test_media_extension_profile_uses_the_device_plugins_resource_name():
    # NVIDIA/k8s-device-plugin names the 1g.10gb+me profile's resource nvidia.com/mig-1g.10gb.me
    mig = {"kind": "mig", "profile": "1g.10gb+me"}
    assert resource_limits(mig) == {"nvidia.com/mig-1g.10gb.me": "1"}
    assert resource_limits({"kind": "mig", "profile": "1g.10gb"}) == {"nvidia.com/mig-1g.10gb": "1"}
    assert resource_limits(mig, NodeResources(mig={"1g.10gb+me": "nvidia.com/mig-1g.10gb.me.shared"})) == {
        "nvidia.com/mig-1g.10gb.me.shared": "1"}


def test_resources_are_named_as_the_leases_node_advertises_them():
    single, renamed = NodeResources(mig_single=True), NodeResources(gpu="nvidia.com/gpu.shared")
    shared, whole = SLICES["shared"].to_json(), SLICES["whole"].to_json()
    assert resource_limits({"kind": "mig", "profile": "1g.10gb"}, single) == {"nvidia.com/gpu": "1"}
    template = {"nvidia.com/gpu.shared": "1"}
    assert resource_limits(shared, NodeResources(), shared_resources=template) == {"nvidia.com/gpu": "1"}
    assert resource_limits(shared, renamed, shared_resources=template) == {"nvidia.com/gpu.shared": "1"}
    hami = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "{memory_mib}"}
    assert resource_limits(shared, NodeResources(), shared_resources=hami) == {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192"}
    assert resource_limits(whole, NodeResources()) == {"nvidia.com/gpu": "2"}


PROFILES = [
    {"display_name": "Small", "slug": "small", "default": True,
     "kubespawner_override": {"image": "example.org/small:1", "cpu_limit": 1.0}},
    {"display_name": "Data science", "slug": "ds",
     "kubespawner_override": {"cpu_limit": 4.0, "environment": {"TEAM": "ds"}},
     "profile_options": {"image": {
         "display_name": "Image",
         "choices": {"scipy": {"display_name": "SciPy", "kubespawner_override": {"image": "example.org/scipy:2"}},
                     "torch": {"display_name": "PyTorch", "default": True,
                               "kubespawner_override": {"image": "example.org/torch:3"}}},
         "unlisted_choice": {"enabled": True, "display_name": "Other image",
                             "kubespawner_override": {"image": "{value}"}}}}},
]


def test_profile_list_is_kubespawners_beside_the_gpu_choice():
    async def scenario():
        spawner = make_spawner(service=None, profile_list=PROFILES)
        form = await spawner.get_options_form()
        assert 'name="profile"' in form and "gpualloc-offers" not in form  # no allocator: no GPU field
        options = spawner.options_from_form({"profile": ["ds"], "profile-option-ds--image": ["scipy"],
                                             "gpu": ["mig-3g.40gb"], "_xsrf": ["x"]})
        assert options == {"profile": "ds", "image": "scipy", "gpu": "mig-3g.40gb"}
        spawner.user_options = options
        await spawner.load_user_options()
        assert (spawner.image, spawner.cpu_limit, spawner.environment["TEAM"]) == ("example.org/scipy:2", 4.0, "ds")
        spawner.gpu_lease.adopt(lease_json("mig"))
        return ApiClient().sanitize_for_serialization(await spawner.get_pod_manifest())

    pod = validated(asyncio.run(scenario()))
    container = pod["spec"]["containers"][0]
    assert container["image"] == "example.org/scipy:2"
    assert container["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"
    assert container_env(pod)["TEAM"] == "ds"


def test_the_form_keeps_the_profiles_when_the_allocator_cannot_be_reached():
    async def form() -> str:
        return await make_spawner(profile_list=PROFILES).get_options_form()  # a user the hub cannot make tokens for

    html = asyncio.run(form())
    assert 'name="profile"' in html and html.count('name="gpu"') == 1 and 'value="none" checked' in html
    assert "The GPU allocator is not answering right now: only servers without a GPU can start." in html

    async def gpu_only_form() -> str:
        return await make_spawner(profile_list=PROFILES, gpu_no_gpu_offer=False).get_options_form()

    html = asyncio.run(gpu_only_form())
    assert 'name="gpu"' not in html and "The GPU allocator is not answering right now: no server can start." in html


def test_profile_options_defaults_and_unlisted_choices_apply():
    async def loaded(user_options: dict) -> GPUKubeSpawner:
        spawner = make_spawner(profile_list=PROFILES)
        spawner.user_options = user_options
        await spawner.apply_gpu_options(user_options)  # No GPU: decided without the service
        await spawner.load_user_options()
        return spawner

    assert asyncio.run(loaded({})).image == "example.org/small:1"
    assert asyncio.run(loaded({"profile": "ds", "gpu": "none"})).image == "example.org/torch:3"
    assert asyncio.run(loaded({"profile": "ds", "image--unlisted-choice": "me/mine:4"})).image == "me/mine:4"


def test_a_gpu_choice_without_an_allocator_is_refused_plainly():
    async def apply():
        await make_spawner(service=None).apply_gpu_options({"profile": "ds", "gpu": "mig-3g.40gb"})

    with pytest.raises(SpawnException) as caught:
        asyncio.run(apply())
    assert caught.value.status_code == 503
    assert caught.value.jupyterhub_message == "This hub has no GPU allocator: choose No GPU to start without a GPU."


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
    assert set(hub["config"]["KubeGpu"]) <= set(KubeGpu.class_trait_names(config=True))
    assert "gpualloc" in hub["services"] and settings["gpualloc_url"].endswith("/services/gpualloc/")
    access = "access:services!service=gpualloc"
    assert access in hub["loadRoles"]["user"]["scopes"] and access in hub["loadRoles"]["server"]["scopes"]
    assert "custom:gpualloc:admin" in hub["config"]["JupyterHub"]["custom_scopes"]
    pod = pod_for("mig", **{k: v for k, v in settings.items() if k not in ("gpualloc_url",)})
    assert container_env(pod)["GPUALLOC_URL"] == settings["gpualloc_server_url"]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"

    async def with_profile():
        spawner = make_spawner(profile_list=values["singleuser"]["profileList"])
        spawner.user_options = spawner.options_from_form({"profile": ["pytorch"], "gpu": ["mig-3g.40gb"]})
        await spawner.load_user_options()
        return spawner.image, spawner.user_options["gpu"]

    assert asyncio.run(with_profile()) == ("quay.io/jupyter/pytorch-notebook:cuda12-2024-12-09", "mig-3g.40gb")
