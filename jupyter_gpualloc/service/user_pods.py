"""The pods the service makes for a user's slice: a copy of the user's server pod with the lease's GPU.

A running pod cannot gain a device, so on Kubernetes a background job (service/job_pods.py) and a
GPU kernel (service/kernel_pods.py) run in pods of their own, which the service makes for the user
(it holds the RBAC; users and their servers get no Kubernetes API rights). Each takes from the
user's server pod, as the cluster watch sees it (KubeSpawner's annotations name the user and the
server): image, env without the server's own hub credentials and slice, volumes and mounts (the
home, so files are where the notebook is), security contexts, pull secrets, CPU and memory, the
labels zero-to-jupyterhub's NetworkPolicies select user pods by (`component`, `app`, `release`,
`hub.jupyter.org/*`: a kernel's or job's pod is fenced in as its server is) and z2jh's init
container that blocks the cloud metadata server (`block-cloud-metadata`), where the server has it; and
from the lease: the extended resources its node advertises, node affinity to that node and the
GPU tolerations (`c.KubeGpu`, kube/gpu.py, as for server pods). No service-account token is mounted.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, Callable, Mapping

from traitlets import Dict, Enum
from traitlets.config import LoggingConfigurable

from ..core.devices.kubernetes import NodeResources
from ..core.holders import SERVER
from ..core.model import SliceSpec, SpecError
from ..kube.claims import pod_claim
from ..kube.gpu import KubeGpu
from ..lease_env import SLICE_ENV_NAMES, slice_env

HUB_USER = "hub.jupyter.org/username"  # KubeSpawner's annotation: the user's name, unescaped
HUB_SERVER = "hub.jupyter.org/servername"  # and the server's name ('' for the default server)
# what a pod of the service's does not take from the server's env: the server's own hub credentials
# and URLs (revoked when it stops)
_NOT_COPIED_ENV = ("JUPYTERHUB_", "JPY_")
_COPIED_POD_FIELDS = ("volumes", "securityContext", "imagePullSecrets", "tolerations", "priorityClassName",
                      "schedulerName", "dnsPolicy", "dnsConfig", "hostAliases")
_COPIED_CONTAINER_FIELDS = ("image", "imagePullPolicy", "env", "envFrom", "volumeMounts", "workingDir",
                            "securityContext")
# the labels z2jh's NetworkPolicies select a user's pods by (its `jupyterhub.matchLabels`), besides hub.jupyter.org/*
_NETWORK_POLICY_LABELS = ("component", "app", "release")
# z2jh's init container that blocks the cloud metadata server with iptables (singleuser.cloudMetadata)
METADATA_BLOCKER = "block-cloud-metadata"


class NoServerPod(SpecError):
    """The requesting server has no pod to copy (it is not running on this cluster)."""


class UserPods(LoggingConfigurable):
    """How the service's pods for a user's slice are made (see the module)."""

    home_access_mode = Enum(
        ["ReadWriteMany", "ReadWriteOnce"], "ReadWriteMany",
        help="""How the users' homes are mounted. ReadWriteMany (NFS and the like): a kernel's pod may run on
        any node. ReadWriteOnce (a default zero-to-jupyterhub install's dynamic PVCs): the home mounts on
        one node only, so a GPU kernel's or a job's pod asks for a slice on its server's node, and runs there.""",
    ).tag(config=True)
    pod_annotations = Dict(
        {}, help="""Annotations put on every job's and kernel's pod, e.g.
        {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}.""",
    ).tag(config=True)

    def __init__(self, gpu: KubeGpu, node_resources: Callable[[str], NodeResources | None], **kwargs: Any):
        """`gpu`: the cluster's GPU settings; `node_resources`: the names a node advertises its GPUs by."""
        super().__init__(**kwargs)
        self.gpu, self.node_resources = gpu, node_resources

    def server_template(self, pods: list[Mapping[str, Any]], user: str, server: str, namespace: str) -> dict[str, Any]:
        """What a pod for `user` takes from their server's pod (server: 'server' or 'server:<name>'),
        found among `pods` (the watch's view) in this install's `namespace` (another hub's user of the
        same name is not this one); NoServerPod (a 400 on `runner`) when it is not running."""
        server_name = server.partition(":")[2] if server != SERVER else ""
        found = [p for p in pods if (p.get("metadata") or {}).get("namespace") == namespace
                 and is_server_pod(p, user, server_name)]
        if not found:
            raise NoServerPod("runner", f"no running pod of {user}'s server {server_name or '(default)'!s} "
                                        "to make the pod from: start the server, then try again")
        return pod_template(max(found, key=_created))

    def placed(self, spec: SliceSpec, template: Mapping[str, Any], what: str) -> SliceSpec:
        """Where a pod made from `template` for `what` (a GPU kernel, a job) may be granted its slice:
        anywhere `spec` says, or with ReadWriteOnce homes on the server's node only (its home mounts
        there); SpecError naming `spec.node` for another node."""
        if self.home_access_mode != "ReadWriteOnce":
            return spec
        node = template.get("node") or ""
        if not node:
            raise SpecError("runner", f"homes mount on one node here (ReadWriteOnce), and the server's pod "
                                      f"{template.get('server_pod', '')} has no node yet: try again once it runs")
        if spec.node not in (None, node):
            raise SpecError("spec.node", f"homes mount on one node here (ReadWriteOnce): a {what} runs on its "
                                         f"server's node {node}, not {spec.node}")
        return replace(spec, node=node)

    def pod_spec(self, template: Mapping[str, Any], lease: Mapping[str, Any], *, container: str,
                 command: list[str], working_dir: str, env: list[dict[str, Any]], grace_seconds: int,
                 service_url: str = "", claim: str | None = None) -> dict[str, Any]:
        """A pod spec from `template` for granted `lease`: its container `container` runs `command`
        in `working_dir` with the server's env, the lease's slice env (no device names: the device
        plugin, or on a DRA node the driver, gives the devices) and `env` added; the service's URL is
        `service_url` or the server's. On a DRA node the pod uses the lease's ResourceClaim `claim`
        (service/dra_claims.py) instead of extended resources."""
        slice_ = lease["slice"]
        copied = dict(template.get("container") or {})
        url = service_url or env_value(copied.get("env", []), "GPUALLOC_URL")
        own = {e["name"] for e in env}  # `env` wins over the server's and the slice's variables of its names
        container_env = [e for e in copied.get("env", []) if e.get("name") not in {*SLICE_ENV_NAMES, *own}]
        container_env += [{"name": k, "value": v} for k, v in slice_env(lease, service_url=url,
                                                                        visible_devices=False).items() if k not in own]
        resources = {kind: dict(values) for kind, values in (template.get("resources") or {}).items()}
        gpus = self.gpu.limits(slice_, self.node_resources(slice_["node"])) if claim is None else {}
        resources["limits"] = {**resources.get("limits", {}), **gpus}
        claims: dict[str, Any] = {}
        if claim is not None:
            claims["resourceClaims"], resources["claims"] = pod_claim(claim)
        return {**template.get("spec", {}), **claims,
                "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
                "terminationGracePeriodSeconds": grace_seconds,
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [self.gpu.node_term(slice_["node"])]}}},
                "tolerations": [*template.get("spec", {}).get("tolerations", []), *self.gpu.tolerations],
                "containers": [{**copied, "name": container, "command": command, "workingDir": working_dir,
                                "env": container_env + env, "resources": resources}]}

    def labels(self, template: Mapping[str, Any], component: str, **own: str) -> dict[str, str]:
        """The server's hub and z2jh labels (network policies select on them), the component, and `own`."""
        return {**template.get("labels", {}), **own, "app.kubernetes.io/managed-by": "jupyter-gpualloc",
                "app.kubernetes.io/component": component}


def pod_template(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What a pod of the service's copies from a server's pod (a Pod object as the API returns it)."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    containers = spec.get("containers") or [{}]
    server = next((c for c in containers if c.get("name") == "notebook"), containers[0])
    container = {k: server[k] for k in _COPIED_CONTAINER_FIELDS if k in server}
    container["env"] = [e for e in server.get("env") or []
                        if not e.get("name", "").startswith(_NOT_COPIED_ENV) and e.get("name") != "GPUALLOC_TOKEN"]
    resources = server.get("resources") or {}
    copied_spec = {k: spec[k] for k in _COPIED_POD_FIELDS if k in spec}
    blockers = [c for c in spec.get("initContainers") or [] if c.get("name") == METADATA_BLOCKER]
    if blockers:
        copied_spec["initContainers"] = blockers
    return {
        "namespace": metadata.get("namespace", "default"),
        "server_pod": metadata.get("name", ""),
        "server_pod_uid": metadata.get("uid", ""),
        "node": spec.get("nodeName") or "",
        "labels": {k: v for k, v in (metadata.get("labels") or {}).items()
                   if k.startswith("hub.jupyter.org/") or k in _NETWORK_POLICY_LABELS},
        "container": container,
        "resources": {kind: {k: v for k, v in (resources.get(kind) or {}).items() if k in ("cpu", "memory")}
                      for kind in ("requests", "limits") if resources.get(kind)},
        "spec": copied_spec,
    }


SERVER_COMPONENT = "singleuser-server"  # KubeSpawner's `component` label on a user's server pod


def is_server_pod(pod: Mapping[str, Any], user: str, server_name: str) -> bool:
    """Whether `pod` is KubeSpawner's pod of `user`'s server `server_name` ('' the default one), running."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return (annotations.get(HUB_USER) == user and annotations.get(HUB_SERVER, "") == server_name
            and (metadata.get("labels") or {}).get("component") == SERVER_COMPONENT
            and (pod.get("status") or {}).get("phase") in ("Pending", "Running")
            and not metadata.get("deletionTimestamp"))


def _created(pod: Mapping[str, Any]) -> str:
    """Where a server has several pods (one replacing another), the newest is the server's."""
    return (pod.get("metadata") or {}).get("creationTimestamp") or ""


def env_value(env: list[Mapping[str, Any]], name: str) -> str:
    return next((str(e.get("value", "")) for e in env if e.get("name") == name), "")


def api_message(err: Exception) -> str:
    """The API server's message of a kubernetes_asyncio ApiException."""
    try:
        return json.loads(getattr(err, "body", "") or "{}").get("message") or str(err)
    except ValueError:
        return str(err)
