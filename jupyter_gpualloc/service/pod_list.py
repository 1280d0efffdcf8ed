"""A cluster-wide pod list decoded to the fields the service reads of a pod, the rest skipped while
the JSON is decoded (in C, by msgspec): at 20,000 pods, decoding every field (managedFields, env,
volumes, annotations, the spec's defaults) took most of the watch's start-up, for pods of which it
keeps a few fields of a tenth.

What is read is what `pod_record` (core/devices/kubernetes.py) keeps: the name, namespace, labels
and deletion time; the node and every container's resources; the phase, IP, reason, message,
conditions, the containers' states and the DRA claim serving extended resources. A decoded pod is
a dict of those fields, so `pod_record` of it equals `pod_record` of the whole pod. A pod that
`pod_record` can never keep (no NVIDIA device asked for, no lease label: most of a cluster's pods)
is left out of the list, not turned into a dict the watch would drop. The install's server pods,
which the service copies into kernel and Job pods, are listed whole on their own.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..core.devices.kubernetes import LEASE_LABEL, is_gpu_resource


class _Metadata(msgspec.Struct, omit_defaults=True):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    deletionTimestamp: str | None = None


class _Container(msgspec.Struct, omit_defaults=True):
    resources: dict[str, Any] | None = None


class _Spec(msgspec.Struct, omit_defaults=True):
    nodeName: str | None = None
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None


class _ContainerStatus(msgspec.Struct, omit_defaults=True):
    state: dict[str, Any] | None = None


class _Status(msgspec.Struct, omit_defaults=True):
    phase: str | None = None
    podIP: str | None = None
    reason: str | None = None
    message: str | None = None
    conditions: list[dict[str, Any]] | None = None
    containerStatuses: list[_ContainerStatus] | None = None
    extendedResourceClaimStatus: dict[str, Any] | None = None


class _Pod(msgspec.Struct, omit_defaults=True):
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    spec: _Spec = msgspec.field(default_factory=_Spec)
    status: _Status = msgspec.field(default_factory=_Status)


class _ListMetadata(msgspec.Struct):
    resourceVersion: str = ""


class _PodList(msgspec.Struct):
    metadata: _ListMetadata = msgspec.field(default_factory=_ListMetadata)
    items: list[_Pod] | None = None


_DECODER = msgspec.json.Decoder(_PodList)


def decode_pod_list(body: bytes) -> dict[str, Any]:
    """A PodList's JSON as `{"metadata": {"resourceVersion": ...}, "items": [pod, ...]}`, each pod a
    dict of the fields read (see the module's docstring). msgspec.DecodeError (a ValueError) when the
    body is not a PodList."""
    listed = _DECODER.decode(body)
    return {"metadata": {"resourceVersion": listed.metadata.resourceVersion},
            "items": msgspec.to_builtins([pod for pod in listed.items or () if _may_be_kept(pod)])}


def _may_be_kept(pod: _Pod) -> bool:
    """What `pod_record` asks of a pod before it keeps it: a lease label, or an NVIDIA device asked for
    by a container or an init container (as a request or a limit)."""
    if pod.metadata.labels and LEASE_LABEL in pod.metadata.labels:
        return True
    for container in (*(pod.spec.containers or ()), *(pod.spec.initContainers or ())):
        for asked in (container.resources or {}).get("requests"), (container.resources or {}).get("limits"):
            if asked and any(is_gpu_resource(name) for name in asked):
                return True
    return False
