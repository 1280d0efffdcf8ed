"""KubernetesBackend: GPU capacity from Node objects (fixtures as the API server returns them)."""

from __future__ import annotations

import json
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpualloc.core import mig
from jupyter_gpualloc.core.devices import kubernetes, make_backend
from jupyter_gpualloc.core.devices.base import DeviceError, DevicePermissionError
from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend, node_from_object, parse_quantity
from jupyter_gpualloc.core.model import MigMode

NODE_LIST = json.loads((Path(__file__).parent / "k8s_nodes.json").read_text())
NODES = {n["metadata"]["name"]: n for n in NODE_LIST["items"]}


@pytest.fixture
def fleet():
    return {n.name: n for n in KubernetesBackend.from_node_objects(NODE_LIST["items"]).discover()}


@pytest.mark.parametrize("text, value", [
    ("32", 32), ("31500m", Decimal("31.5")), ("128Gi", 128 * 2**30), ("131072Ki", 2**27),
    ("1e3", 1000), ("500M", 500 * 10**6), ("0.5", Decimal("0.5")), (4, 4)])
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


def test_parse_quantity_rejects_garbage():
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity("12 apples")


def test_gpu_nodes_only_with_cordoned_and_not_ready_ones_marked_unschedulable(fleet):
    assert sorted(fleet) == ["a100-mixed", "a100-single", "h100-half-mig", "l4-cordoned", "l4-notready",
                             "l4-pool-1", "t4-shared"]
    assert {name: node.unschedulable for name, node in fleet.items() if node.unschedulable} == {
        "l4-cordoned": "cordoned", "l4-notready": "not Ready"}


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def tainted(*taints: dict) -> dict:
    node = json.loads(json.dumps(NODES["l4-pool-1"]))
    node["spec"] = {**node.get("spec", {}), "taints": list(taints)}
    return node


@pytest.mark.parametrize("taints, tolerations, reason", [
    ([{"key": "dedicated", "value": "ml-team", "effect": "NoSchedule"}], [GPU_TOLERATION],
     "tainted dedicated=ml-team:NoSchedule, which this install's GPU pods do not tolerate"),
    ([{"key": "maintenance", "effect": "NoExecute"}], [GPU_TOLERATION],
     "tainted maintenance:NoExecute, which this install's GPU pods do not tolerate"),
    ([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}], [GPU_TOLERATION], None),
    ([{"key": "dedicated", "value": "ml-team", "effect": "PreferNoSchedule"}], [GPU_TOLERATION], None),
    ([{"key": "dedicated", "value": "ml-team", "effect": "NoSchedule"}],
     [GPU_TOLERATION, {"key": "dedicated", "value": "ml-team", "effect": "NoSchedule"}], None),
    ([{"key": "dedicated", "value": "ml-team", "effect": "NoSchedule"}],  # another value is not tolerated
     [{"key": "dedicated", "operator": "Equal", "value": "data-team"}],
     "tainted dedicated=ml-team:NoSchedule, which this install's GPU pods do not tolerate"),
    ([{"key": "dedicated", "value": "ml-team", "effect": "NoSchedule"}], [{"operator": "Exists"}], None),
])
def test_a_node_whose_taints_the_pods_do_not_tolerate_is_drained_saying_which(taints, tolerations, reason):
    [node] = KubernetesBackend.from_node_objects([tainted(*taints)]).discover()  # taints judged by nobody
    assert node.unschedulable is None
    backend = KubernetesBackend(lambda: [tainted(*taints)], tolerations=tolerations)
    [node] = backend.discover()
    assert node.unschedulable == reason and len(node.gpus) == 4


def test_a_taint_added_or_removed_is_read_again():
    objects = [tainted()]
    backend = KubernetesBackend(lambda: json.loads(json.dumps(objects)), tolerations=[GPU_TOLERATION])
    assert backend.discover()[0].unschedulable is None
    objects[0]["spec"]["taints"] = [{"key": "dedicated", "value": "ml-team", "effect": "NoSchedule"}]
    assert backend.discover()[0].unschedulable.startswith("tainted dedicated=ml-team:NoSchedule")
    objects[0]["spec"]["taints"] = []
    assert backend.discover()[0].unschedulable is None


def test_mixed_strategy_mig_devices_become_static_instances(fleet):
    node = fleet["a100-mixed"]
    assert (node.cpu_milli, node.memory_mib) == (95500, 1056375180 // 1024)
    assert len(node.gpus) == 2
    profiles = mig.lookup_model("A100-SXM4-40GB").profiles
    names = []
    for gpu in node.gpus:
        assert (gpu.model, gpu.mig_mode, gpu.mig_capable, gpu.memory_mib) == (
            "A100-SXM4-40GB", MigMode.STATIC, True, 40960)
        assert mig.is_legal(gpu.instances, profiles)  # all-balanced: 3g + 2g + 2x 1g on each GPU
        names += [profiles[i.profile_id].name for i in gpu.instances]
        assert all(i.uuid.startswith("MIG-") for i in gpu.instances)
    assert sorted(names) == ["1g.5gb"] * 4 + ["2g.10gb"] * 2 + ["3g.20gb"] * 2


def test_mixed_strategy_with_whole_and_mig_gpus(fleet):
    whole, cut = fleet["h100-half-mig"].gpus
    assert (whole.model, whole.mig_mode, whole.memory_mib, whole.instances) == ("H100 80GB HBM3", MigMode.OFF, 81559, [])
    assert cut.mig_mode is MigMode.STATIC
    assert [(i.profile_id, i.start) for i in cut.instances] == [(9, 0), (9, 4)]
    assert fleet["h100-half-mig"].cpu_milli == 63000


def test_single_strategy(fleet):
    node = fleet["a100-single"]
    assert len(node.gpus) == 2  # 14 advertised 1g.10gb devices, 7 per A100-80GB
    for gpu in node.gpus:
        assert gpu.model == "A100-SXM4-80GB" and gpu.memory_mib == 81920
        assert [i.start for i in gpu.instances] == list(range(7))
        assert {i.profile_id for i in gpu.instances} == {19}


def test_whole_and_time_sliced_gpus(fleet):
    l4 = fleet["l4-pool-1"]
    assert [(g.model, g.memory_mib, g.mig_capable, g.mig_mode) for g in l4.gpus] == [("L4", 23034, False, MigMode.OFF)] * 4
    assert (l4.cpu_milli, l4.memory_mib) == (47500, 192 * 1024)
    t4 = fleet["t4-shared"]
    assert [(g.model, g.memory_mib) for g in t4.gpus] == [("T4", 15360)]  # 4 replicas of one T4
    # the device plugin gives a plain GPU to one pod, and a time-sliced one only by replicas
    assert {g.sharing for g in l4.gpus} == {"whole"} and t4.gpus[0].sharing == "shared"


def test_each_node_says_the_names_its_gpus_are_advertised_by():
    backend = KubernetesBackend.from_node_objects([*NODE_LIST["items"], renamed_shared_node()])
    backend.discover()
    mixed, single = backend.node_resources("a100-mixed"), backend.node_resources("a100-single")
    assert (mixed.mig_single, mixed.mig["2g.10gb"], mixed.gpu) == (False, "nvidia.com/mig-2g.10gb", "nvidia.com/gpu")
    assert (single.mig_single, single.gpu) == (True, "nvidia.com/gpu")
    assert backend.node_resources("t4-shared").gpu == "nvidia.com/gpu"  # time-sliced, not renamed
    assert backend.node_resources("t4-renamed").gpu == "nvidia.com/gpu.shared"
    assert backend.node_resources("cpu-only") is None and backend.node_resources("no-such-node") is None


def test_a_pod_whose_gpus_a_dra_claim_serves_is_counted_by_its_claim_not_again_by_its_resources():
    """KEP-5004: where NVIDIA's DRA driver serves `nvidia.com/gpu`, the kube-scheduler gives a pod asking
    for it a claim of its own and says so in the pod's status; that claim's devices are the pod's."""
    backend = KubernetesBackend.from_node_objects(NODE_LIST["items"])
    backend.discover()
    pod = {"metadata": {"namespace": "ml", "name": "train"},
           "spec": {"nodeName": "l4-pool-1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
           "status": {"phase": "Running"}}
    assert backend.outside_use(kubernetes.pod_record(pod)).whole == 2
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "train-extended-resources-x7k2p",
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0"}]}
    assert backend.outside_use(kubernetes.pod_record(pod)) is None
    assert backend.outside_use(pod) is None


def renamed_shared_node() -> dict:
    node = json.loads(json.dumps(NODES["t4-shared"]))
    node["metadata"]["name"] = "t4-renamed"
    node["status"]["allocatable"] = {**node["status"]["allocatable"], "nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "4"}
    return node


def test_uuids_are_stable_identifiers(fleet):
    again = {n.name: n for n in KubernetesBackend.from_node_objects(NODE_LIST["items"]).discover()}
    assert [g.uuid for g in fleet["l4-pool-1"].gpus] == [g.uuid for g in again["l4-pool-1"].gpus]
    all_uuids = [g.uuid for n in fleet.values() for g in n.gpus]
    assert len(set(all_uuids)) == len(all_uuids)


def test_mig_is_managed_by_the_mig_manager(fleet):
    backend = KubernetesBackend.from_node_objects(NODE_LIST["items"])
    gpu = backend.discover()[0].gpus[0]
    assert gpu.mig_mode is MigMode.STATIC  # a device-plugin MIG GPU; DRA nodes' DynamicMIG ones change (test_dra.py)
    assert backend.mig_profiles(gpu.uuid)[9].name == "3g.20gb"
    assert backend.mig_profiles(fleet["l4-pool-1"].gpus[0].uuid) == {}
    with pytest.raises(DevicePermissionError, match="managed by the NVIDIA MIG manager"):
        backend.create_mig_instance(gpu.uuid, 19, 0)
    with pytest.raises(DevicePermissionError, match="managed by the NVIDIA MIG manager"):
        backend.destroy_mig_instance(gpu.uuid, gpu.instances[0].uuid)
    assert backend.process_memory() == []
    with pytest.raises(DeviceError, match="no GPU GPU-gone"):
        backend.mig_profiles("GPU-gone")


def test_inconsistent_mig_resources_are_reported():
    node = json.loads(json.dumps(NODES["a100-mixed"]))
    node["status"]["allocatable"]["nvidia.com/mig-4g.20gb"] = "3"
    with pytest.raises(DeviceError, match=r"node a100-mixed: the advertised MIG devices .* do not fit on 2"):
        node_from_object(node)
    node = json.loads(json.dumps(NODES["l4-pool-1"]))
    node["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] = "1"
    with pytest.raises(DeviceError, match="node l4-pool-1: advertises MIG devices on L4, which is not a MIG-capable model"):
        node_from_object(node)


def test_without_gpu_count_label_the_fewest_gpus_hold_the_devices():
    node = json.loads(json.dumps(NODES["a100-mixed"]))
    del node["metadata"]["labels"]["nvidia.com/gpu.count"]
    gpus = node_from_object(node).gpus
    assert len(gpus) == 2 and sum(len(g.instances) for g in gpus) == 8


class _NodeApi(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        body = json.dumps(NODE_LIST).encode()
        self.server.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_from_cluster_lists_nodes_with_kubernetes_asyncio(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NodeApi)
    server.paths = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        "users": [{"name": "test", "user": {"token": "not-a-secret"}}]}))
    try:
        backend = make_backend("kubernetes", kubeconfig=str(kubeconfig), label_selector="nvidia.com/gpu.present=true")
        names = [n.name for n in backend.discover()]
    finally:
        server.shutdown()
        server.server_close()
    assert names == ["a100-mixed", "h100-half-mig", "a100-single", "l4-pool-1", "t4-shared", "l4-cordoned", "l4-notready"]
    path, _, query = server.paths[0].partition("?")
    assert path == "/api/v1/nodes" and parse_qs(query)["labelSelector"] == ["nvidia.com/gpu.present=true"]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), model_name=st.sampled_from(["A100-SXM4-80GB", "A30", "H100 80GB HBM3"]),
       gpus=st.integers(1, 8), whole=st.integers(0, 2))
def test_any_mix_of_legal_gpu_layouts_reads_back_on_as_many_gpus(data, model_name, gpus, whole):
    """Advertise what `gpus` MIG GPUs of legal, non-empty layouts hold (custom config), beside whole GPUs:
    the node reads back with the same totals, legal layouts and GPU counts."""
    model = mig.lookup_model(model_name)
    layouts = sorted(counts for counts in kubernetes._one_gpu_layouts(kubernetes._shape(model)) if counts)
    totals: dict[int, int] = {}
    for _ in range(gpus):
        for pid, n in data.draw(st.sampled_from(layouts)):
            totals[pid] = totals.get(pid, 0) + n
    labels = {"nvidia.com/gpu.product": f"NVIDIA-{model_name.replace(' ', '-')}", "nvidia.com/mig.strategy": "mixed",
              "nvidia.com/gpu.count": str(gpus + whole), "nvidia.com/mig.config": "custom",
              "nvidia.com/mig.config.state": "success"}
    allocatable = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(whole)}
    allocatable.update({f"nvidia.com/mig-{model.profile(pid).name.replace('+me', '.me')}": str(n)
                        for pid, n in totals.items() if n})
    node = node_from_object({"metadata": {"name": "n", "labels": labels}, "status": {"allocatable": allocatable}})
    assert len(node.gpus) == gpus + whole
    assert sum(g.mig_mode is MigMode.OFF for g in node.gpus) == whole
    read: dict[int, int] = {}
    for gpu in node.gpus:
        assert mig.is_legal(gpu.instances, model.profiles)
        for instance in gpu.instances:
            read[instance.profile_id] = read.get(instance.profile_id, 0) + 1
    assert read == {pid: n for pid, n in totals.items() if n}
