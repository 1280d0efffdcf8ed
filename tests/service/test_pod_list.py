"""service/pod_list.py: a pod list decoded to what is read gives the watch exactly what the whole pods give it."""

from __future__ import annotations

import json

import msgspec
import pytest

from jupyter_gpualloc.core.devices.kubernetes import INSTANCE_LABEL, LEASE_LABEL, own_pod, pod_record
from jupyter_gpualloc.service.pod_list import decode_pod_list

STATUS_ENDED = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
                "podIP": "10.1.0.7", "containerStatuses": [
                    {"name": "main", "ready": False, "restartCount": 0, "image": "train:1", "imageID": "",
                     "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": "2026-12-07T10:00:00Z",
                                              "finishedAt": "2026-12-07T10:05:00Z"}}, "lastState": {}}]}
UNSCHEDULABLE = {"phase": "Pending", "qosClass": "BestEffort", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
     "lastTransitionTime": "2026-12-07T10:00:00Z", "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}
EXTENDED = {"phase": "Running", "extendedResourceClaimStatus": {
    "resourceClaimName": "train-extended-resources-x7k2p",
    "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0"}]}}


def pod(name: str, *, labels=None, limits=None, init_limits=None, status=None, deleting=False, node="gpu-1") -> dict:
    """A pod as the API server returns it, with the fields nobody reads (managedFields, env, volumes, ...)."""
    metadata = {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": "812",
                "creationTimestamp": "2026-12-07T10:00:00Z", "labels": labels or {"app": "web"},
                "annotations": {"prometheus.io/scrape": "true"},
                "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:spec": {"f:containers": {}}}}]}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-07T11:00:00Z"
    container = {"name": "main", "image": "train:1", "env": [{"name": "A", "value": "1"}],
                 "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}], "terminationMessagePath": "/dev/x",
                 "resources": {"limits": dict(limits or {}), "requests": {"cpu": "100m", **(limits or {})}}}
    spec = {"nodeName": node, "containers": [container], "volumes": [{"name": "config", "configMap": {"name": "c"}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
            "dnsPolicy": "ClusterFirst", "restartPolicy": "Always"}
    if init_limits:
        spec["initContainers"] = [{"name": "warm", "image": "warm:1", "resources": {"limits": dict(init_limits)}}]
    return {"metadata": metadata, "spec": spec, "status": status or {"phase": "Running", "podIP": "10.1.0.3",
                                                                       "hostIP": "10.0.0.1", "startTime": "x"}}


PODS = [
    pod("web"),
    pod("train", limits={"nvidia.com/gpu": "2"}),
    pod("mig", limits={"nvidia.com/mig-1g.10gb": "1"}, init_limits={"nvidia.com/mig-1g.10gb": "3"}),
    pod("oom", limits={"nvidia.com/gpu": "1"}, status=STATUS_ENDED),
    pod("pending", limits={"nvidia.com/gpu": "8"}, status=UNSCHEDULABLE, node=None),
    pod("extended", limits={"nvidia.com/gpu": "1"}, status=EXTENDED),
    pod("kernel", labels={LEASE_LABEL: "l-1", INSTANCE_LABEL: "ml.gpualloc", "app": "k"}, deleting=True),
    pod("fpga", limits={"example.com/fpga": "1"}),
    pod("own-label", labels={INSTANCE_LABEL: "ml.gpualloc"}),
]


def requests_only(name: str, resource: str) -> dict:
    """A pod that asks for a device as a request alone (the API server would copy it to the limits)."""
    made = pod(name)
    made["spec"]["containers"][0]["resources"] = {"requests": {resource: "1"}}
    return made


PODS += [requests_only("requested-gpu", "nvidia.com/gpu.shared"), requests_only("requested-cpu", "cpu")]


def test_a_decoded_pod_reads_as_the_whole_pod_does_and_the_pods_never_kept_are_left_out():
    decoded = decode_pod_list(json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "901"},
                                          "items": PODS}).encode())
    assert decoded["metadata"]["resourceVersion"] == "901"
    kept = [p for p in PODS if pod_record(p) is not None]
    assert [p["metadata"]["name"] for p in decoded["items"]] == [p["metadata"]["name"] for p in kept] == [
        "train", "mig", "oom", "pending", "extended", "kernel", "requested-gpu"]
    assert [pod_record(p) for p in decoded["items"]] == [pod_record(p) for p in kept]
    assert [own_pod(p, "ml", "ml.gpualloc") for p in decoded["items"]] == [own_pod(p, "ml", "ml.gpualloc") for p in kept]
    assert own_pod(decoded["items"][5], "ml", "ml.gpualloc").deleting
    assert "managedFields" not in decoded["items"][0]["metadata"] and "env" not in decoded["items"][0]["spec"]["containers"][0]


def test_an_empty_list_and_a_body_that_is_no_pod_list():
    assert decode_pod_list(b'{"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": null}') == {
        "metadata": {"resourceVersion": "7"}, "items": []}
    with pytest.raises(ValueError):
        decode_pod_list(b'{"items": "not a list"}')
    assert issubclass(msgspec.DecodeError, ValueError)  # the watch takes a ValueError as a failed list, and retries
