"""GPU kernels in pods of their own on the real control plane (c.GpuAllocService.kernel_pods).

The kernel manager is jupyter_client's, with the project's provisioner and a GPU kernelspec made
from the service's offers, as a user's server starts a kernel. kwok runs no process in a pod, so the
test plays the kubelet: once the kernel's pod is Running it starts the pod's command (a real
ipykernel) with the pod's env and the connection file from the Secret the service made, listening
on the pod's IP (the control plane gives pods loopback addresses, 127.8.x.y, so it can), and ends
that process when the pod is deleted. The kernel manager connects to the pod's IP and runs code.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from pathlib import Path

import pytest

from tests.processes import start_logged
from tests.service.conftest import ALICE, BOB, ROOT

from .test_cluster import until
from .test_job_pods import JobPodService, own_nodes, server_pod, wait_for, wait_for_nodes

client = pytest.importorskip("kubernetes_asyncio.client")

KERNEL_LABEL = "gpualloc.jupyter.org/kernel"
NODES = {"gpu-h100-kernels": "gpu-h100-mig-1", "gpu-l4-shared-kernels": "gpu-l4-shared-1"}
MIG_1G = {"kind": "mig", "profile": "1g.10gb", "node": "gpu-h100-kernels"}


@pytest.fixture(scope="module")
def service(k8s_cluster, tmp_path_factory, install_namespace):
    with own_nodes(k8s_cluster, NODES):
        svc = JobPodService(tmp_path_factory.mktemp("service-kernel-pods"), k8s_cluster.kubeconfig,
                            "c.GpuAllocService.kernel_pods = True\nc.SchedulerPolicy.idle_grace = 1\n",
                            namespace=install_namespace)
        svc.start()
        try:
            wait_for_nodes(svc, NODES)
            yield svc
        finally:
            svc.kill()


@pytest.fixture
def namespace(install_pods) -> str:
    """The service's namespace, where its pods are its own; what a test leaves there is deleted after it."""
    return install_pods


@pytest.fixture
def server(service, k8s_cluster, namespace, tmp_path):
    """alice's CPU-only server pod (a named server of this test's), Running, her home in tmp_path."""
    name = f"s{uuid.uuid4().hex[:8]}"
    k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(
        namespace, server_pod(service, "alice", tmp_path, server_name=name)))
    return f"server:{name}"


def kernel_manager(service, server: str, tmp_path: Path, spec: dict):
    """jupyter_client's kernel manager on a GPU kernelspec for `spec`, the provisioner linked to the
    service as alice's server `server` links it (GPU kernels in pods of their own)."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    from jupyter_gpualloc.client import GpuAllocClient
    from jupyter_gpualloc.server.kernelspecs import install_kernelspecs
    from jupyter_gpualloc.server.provisioner import KernelLink, install_link

    offer = {"name": "test-slice", "label": "1g.10gb", "spec": spec, "available": 1}
    [name] = install_kernelspecs([offer], prefix=str(tmp_path / "prefix"))
    kernel_json = tmp_path / "prefix" / "share" / "jupyter" / "kernels" / name / "kernel.json"
    made = json.loads(kernel_json.read_text())
    del made["metadata"]["kernel_provisioner"]["config"]["offer"]  # a spec of its own (pinned to the test's node)
    kernel_json.write_text(json.dumps(made))
    gpu_client = GpuAllocClient(service.root_url, ALICE, env={"JUPYTERHUB_SERVER_NAME": server.partition(":")[2]})
    install_link(KernelLink(gpu_client, service.root_url, ALICE, kernel_pods=True, wait_timeout=120))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "prefix" / "share" / "jupyter" / "kernels")])
    return AsyncKernelManager(kernel_name=name, kernel_spec_manager=specs)


async def play_the_kubelet(api, namespace: str, kernel_id: str, log: Path, not_pod: str = ""):
    """Once the kernel's pod (other than `not_pod`) Runs: its command, with its env and connection
    file, at its IP."""
    core = client.CoreV1Api(api)

    async def running():
        pods = (await core.list_namespaced_pod(namespace, label_selector=f"{KERNEL_LABEL}={kernel_id}")).items
        return next((p for p in pods if p.status.phase == "Running" and p.status.pod_ip
                     and not p.metadata.deletion_timestamp and p.metadata.name != not_pod), None)

    pod = await until(running, timeout=90, what="the kernel's pod Running")

    async def secret_made():  # the pod is made first (the Secret is owned by it): a kubelet waits to mount it
        secrets = (await core.list_namespaced_secret(namespace, field_selector=f"metadata.name={pod.metadata.name}")).items
        return secrets[0] if secrets else None
    secret = await until(secret_made, what="the kernel pod's Secret")
    data = {k: base64.b64decode(v).decode() for k, v in secret.data.items()}
    connection = {**json.loads(data["connection.json"]), "ip": pod.status.pod_ip}  # its own network's address
    path = log.parent / f"kernel-{kernel_id}.json"
    path.write_text(json.dumps(connection))
    container = pod.spec.containers[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUALLOC_", "JUPYTERHUB_", "CUDA_"))}
    for var in container.env:
        env[var.name] = data[var.value_from.secret_key_ref.key] if var.value_from else (var.value or "")
    mount = next(m.mount_path for m in container.volume_mounts if m.name == "gpualloc-kernel")
    command = [str(path) if part == f"{mount}/connection.json" else part for part in container.command]
    return pod, start_logged(command, log, cwd=container.working_dir, env=env)


async def run_code(km, code: str) -> str:
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        out: list[str] = []
        reply = await kc.execute_interactive(
            code, timeout=30, output_hook=lambda m: out.append(m["content"].get("text", ""))
            if m["msg_type"] == "stream" else None)
        assert reply["content"]["status"] == "ok", reply
        return "".join(out)
    finally:
        kc.stop_channels()


def end_kernels(service, *kernel_ids: str) -> None:
    """A test's kernels end with it, passed or failed: their leases, and so their pods, go (the tests
    after it need the node's slices)."""
    for kernel_id in kernel_ids:
        service.call("DELETE", f"kernels/{kernel_id}/pod", token=ALICE)


def test_offers_say_gpu_kernels_run_in_pods_and_a_running_kernel_hears_how(service):
    sheet = service.call("GET", "offers", token=ALICE).json()
    assert sheet["kernel_pods"] is True
    assert "add --restart to %gpu request" in sheet["refused_holders"]["kernel"], sheet
    reply = service.call("POST", "leases", {"spec": MIG_1G, "holder": "kernel:k-running"}, ALICE)
    assert reply.status == 400 and reply.json()["field"] == "holder", reply


def test_a_gpu_kernel_starts_in_its_own_pod_queued_first_runs_code_and_its_shutdown_ends_pod_and_lease(
        service, server, k8s_cluster, namespace, tmp_path):
    blockers = [service.call("POST", "leases", {"spec": MIG_1G, "holder": f"server:b{i}"}, ROOT).json()
                for i in range(4)]  # every 1g.10gb of the node's two H100s (MIG all-balanced)
    assert [b["state"] for b in blockers] == ["granted"] * 4, blockers
    km = kernel_manager(service, server, tmp_path, MIG_1G)
    kernel_id = str(uuid.uuid4())
    process = None

    async def body(api):
        nonlocal process
        start = asyncio.ensure_future(km.start_kernel(kernel_id=kernel_id, cwd=str(tmp_path)))
        queued = await until(lambda: _queued(service, kernel_id), what="the kernel queued")
        assert queued["position"] == 1 and not start.done(), queued  # no launch timeout: it waits its turn
        assert (await asyncio.to_thread(service.call, "DELETE", f"leases/{blockers[0]['id']}?holder_gone=true",
                                        None, ROOT)).status == 200
        pod, process = await play_the_kubelet(api, namespace, kernel_id, tmp_path / "kernel.log")
        await asyncio.wait_for(start, 60)
        assert pod.spec.node_name == "gpu-h100-kernels"
        assert pod.spec.containers[0].resources.limits["nvidia.com/mig-1g.10gb"] == "1"
        assert [o.kind for o in pod.metadata.owner_references] == ["Pod"]  # the server's: it takes them along
        assert pod.spec.automount_service_account_token is False
        names = [var.name for var in pod.spec.containers[0].env]
        assert len(names) == len(set(names)), names  # the kernel's own GPUALLOC_URL, not the server's beside it
        out = await run_code(km, "import os\nprint(os.environ['GPUALLOC_SLICE_KIND'], os.getcwd())")
        assert out.strip() == f"mig {tmp_path}", out

        # a restart: the old pod goes with its lease, a new one comes for a new lease
        restart = asyncio.ensure_future(km.restart_kernel(now=True))
        second, again = await play_the_kubelet(api, namespace, kernel_id, tmp_path / "kernel-2.log",
                                               not_pod=pod.metadata.name)
        process.kill()  # the first pod was deleted: its process ends
        process = again
        await asyncio.wait_for(restart, 60)
        assert second.metadata.labels["gpualloc.jupyter.org/lease"] != pod.metadata.labels["gpualloc.jupyter.org/lease"]
        assert (await run_code(km, "print(40 + 2)")).strip() == "42"
        await km.shutdown_kernel(now=True)

        async def gone():
            pods = (await client.CoreV1Api(api).list_namespaced_pod(
                namespace, label_selector=f"{KERNEL_LABEL}={kernel_id}")).items
            return not pods
        await until(gone, what="the kernel's pod deleted")

    try:
        k8s_cluster.run(body, timeout=240)
    finally:
        if process is not None:  # the kubelet ends the pod's process
            process.kill()
            process.wait(10)
        end_kernels(service, kernel_id)
        for blocker in blockers[1:]:
            service.call("DELETE", f"leases/{blocker['id']}?holder_gone=true", token=ROOT)
    wait_for(lambda: service.call("GET", "leases", token=ALICE).json()["leases"] == [], what="the kernel's lease ended")


def _queued(service, kernel_id: str):
    async def check():
        reply = await asyncio.to_thread(service.call, "GET", f"kernels/{kernel_id}/pod", None, ALICE)
        return reply.json() if reply.status == 200 and reply.json()["state"] == "queued" else None
    return check()


def test_a_kernel_pod_request_names_its_bad_field(service, server):
    body = {"spec": MIG_1G, "server": server, "argv": ["python"],
            "connection": {"key": "k", "signature_scheme": "hmac-sha256", "shell_port": 1, "iopub_port": 2,
                           "stdin_port": 3, "control_port": 4, "hb_port": 5}}
    bad_id = service.call("POST", "kernels/Not_A_Pod_Name/pod", body, ALICE)
    assert bad_id.status == 400 and bad_id.json()["field"] == "kernel_id", bad_id
    no_ports = service.call("POST", "kernels/k1/pod", {**body, "connection": {"key": "k"}}, ALICE)
    assert no_ports.status == 400 and no_ports.json()["field"].startswith("connection"), no_ports
    assert service.call("GET", "kernels/k1/pod", token=ALICE).status == 404


def test_another_user_can_neither_see_nor_end_a_kernel_pod(service, server):
    body = {"spec": MIG_1G, "server": server, "argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "connection": {"key": "k", "signature_scheme": "hmac-sha256", "shell_port": 1, "iopub_port": 2,
                           "stdin_port": 3, "control_port": 4, "hb_port": 5}}
    kernel_id = str(uuid.uuid4())
    assert service.call("POST", f"kernels/{kernel_id}/pod", body, ALICE).status == 201
    try:
        for method in ("GET", "DELETE"):
            reply = service.call(method, f"kernels/{kernel_id}/pod", token=BOB)
            assert reply.status == 404 and "alice" not in reply.text, reply
        assert service.call("GET", f"kernels/{kernel_id}/pod", token=ALICE).json()["state"] != "ended"
    finally:
        assert service.call("DELETE", f"kernels/{kernel_id}/pod", token=ALICE).json()["state"] == "ended"


def test_with_readwriteonce_homes_a_gpu_kernel_runs_on_its_servers_node(service, k8s_cluster, namespace, tmp_path):
    rwo = JobPodService(tmp_path / "rwo", k8s_cluster.kubeconfig,
                        "c.GpuAllocService.kernel_pods = True\nc.UserPods.home_access_mode = 'ReadWriteOnce'\n"
                        "c.GpuAllocService.instance = 'rwo'\n", namespace=namespace)
    rwo.start()
    try:
        pod = server_pod(rwo, "alice", tmp_path, server_name="rwo")
        pod["spec"]["nodeName"] = "gpu-h100-kernels"  # the server runs on a GPU node, with no GPU of its own
        k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(namespace, pod))
        body = {"spec": {"kind": "mig", "profile": "1g.10gb"}, "server": "server:rwo", "argv": ["python"],
                "connection": {"key": "k", "signature_scheme": "hmac-sha256", "shell_port": 1, "iopub_port": 2,
                               "stdin_port": 3, "control_port": 4, "hb_port": 5}}
        elsewhere = {**body, "spec": {**body["spec"], "node": "gpu-h100-mig-1"}}
        refused = wait_for(lambda: (r := rwo.call("POST", f"kernels/{uuid.uuid4()}/pod", elsewhere, ALICE)).json()
                           .get("field") != "runner" and r, what="the service seeing the server pod")
        assert refused.status == 400 and refused.json()["field"] == "spec.node", refused
        assert "its server's node gpu-h100-kernels" in refused.json()["error"], refused
        kernel_id = str(uuid.uuid4())
        placed = rwo.call("POST", f"kernels/{kernel_id}/pod", body, ALICE).json()
        assert placed["lease"]["spec"]["node"] == "gpu-h100-kernels", placed
        assert rwo.call("DELETE", f"kernels/{kernel_id}/pod", token=ALICE).status == 200
    finally:
        rwo.kill()


def test_a_shared_kernels_pod_asks_for_what_its_node_advertises(service, server, k8s_cluster, namespace):
    """The demo's time-sliced L4s are not renamed: a shared slice there is one `nvidia.com/gpu` replica."""
    body = {"spec": {"kind": "shared", "memory_gib": 4, "node": "gpu-l4-shared-kernels"}, "server": server,
            "argv": ["python"], "connection": {"key": "k", "signature_scheme": "hmac-sha256", "shell_port": 1,
                                               "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}}
    kernel_id = str(uuid.uuid4())
    made = wait_for(lambda: (r := service.call("POST", f"kernels/{kernel_id}/pod", body, ALICE)).json()
                    .get("field") != "runner" and r, what="the service seeing the server pod")
    assert made.status == 201, made
    try:
        async def bound(api):
            async def check():
                return next((p for p in await _kernel_pods(api, namespace, kernel_id) if p.spec.node_name), None)
            return await until(check, timeout=60, what="the kernel's pod bound by kube-scheduler")
        pod = k8s_cluster.run(bound)
        assert pod.spec.node_name == "gpu-l4-shared-kernels"
        limits = pod.spec.containers[0].resources.limits
        assert limits.get("nvidia.com/gpu") == "1" and "nvidia.com/gpu.shared" not in limits, limits
    finally:
        end_kernels(service, kernel_id)


def _kernel_pods(api, namespace: str, kernel_id: str):
    async def listed():
        return (await client.CoreV1Api(api).list_namespaced_pod(
            namespace, label_selector=f"{KERNEL_LABEL}={kernel_id}")).items
    return listed()


def test_a_kernel_in_a_pod_is_interrupted_by_message(service, server, k8s_cluster, namespace, tmp_path):
    km = kernel_manager(service, server, tmp_path, MIG_1G)
    kernel_id = str(uuid.uuid4())
    process = None

    async def body(api):
        nonlocal process
        start = asyncio.ensure_future(km.start_kernel(kernel_id=kernel_id, cwd=str(tmp_path)))
        _, process = await play_the_kubelet(api, namespace, kernel_id, tmp_path / "kernel.log")
        await asyncio.wait_for(start, 60)
        assert km.kernel_spec.interrupt_mode == "message"  # no signal reaches another pod
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            msg_id = kc.execute("import time\ntime.sleep(120)")
            await asyncio.sleep(1)
            await km.interrupt_kernel()
            reply = await kc.get_shell_msg(timeout=20)
            while reply["parent_header"].get("msg_id") != msg_id:  # e.g. a late kernel_info reply of wait_for_ready
                reply = await kc.get_shell_msg(timeout=20)
            assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt", reply
        finally:
            kc.stop_channels()
        await km.shutdown_kernel(now=True)

    try:
        k8s_cluster.run(body, timeout=180)
    finally:
        if process is not None:
            process.kill()
            process.wait(10)
        end_kernels(service, kernel_id)


def test_kernels_in_pods_outlive_a_restart_of_the_service_running_or_queued(
        service, server, k8s_cluster, namespace, tmp_path):
    """The service forgets kernel pod requests when it restarts: a running kernel keeps its pod and
    lease, and a queued one gets its pod once granted (each provisioner tells its request again)."""
    running_km = kernel_manager(service, server, tmp_path, MIG_1G)
    running_id, queued_id = str(uuid.uuid4()), str(uuid.uuid4())
    processes, blockers = [], []

    async def body(api):
        start = asyncio.ensure_future(running_km.start_kernel(kernel_id=running_id, cwd=str(tmp_path)))
        first, process = await play_the_kubelet(api, namespace, running_id, tmp_path / "running.log")
        processes.append(process)
        await asyncio.wait_for(start, 60)
        for i in range(3):  # the node's other 1g.10gb instances
            reply = await asyncio.to_thread(service.call, "POST", "leases",
                                            {"spec": MIG_1G, "holder": f"server:r{i}"}, ROOT)
            blockers.append(reply.json())
        assert [b["state"] for b in blockers] == ["granted"] * 3, blockers
        queued_km = kernel_manager(service, server, tmp_path, MIG_1G)
        queued_start = asyncio.ensure_future(queued_km.start_kernel(kernel_id=queued_id, cwd=str(tmp_path)))
        await until(lambda: _queued(service, queued_id), what="the second kernel queued")

        await asyncio.to_thread(service.kill)  # SIGKILL: what it knew of both requests is gone
        await asyncio.to_thread(service.start)
        assert await running_km.is_alive()  # its provisioner told the request again; the pod is the same
        assert [p.metadata.name for p in await _kernel_pods(api, namespace, running_id)] == [first.metadata.name]
        assert (await run_code(running_km, "print(6 * 7)")).strip() == "42"

        assert (await asyncio.to_thread(service.call, "DELETE", f"leases/{blockers[0]['id']}?holder_gone=true",
                                        None, ROOT)).status == 200
        _, process = await play_the_kubelet(api, namespace, queued_id, tmp_path / "queued.log")
        processes.append(process)
        await asyncio.wait_for(queued_start, 60)
        assert (await run_code(queued_km, "print('queued, then run')")).strip() == "queued, then run"
        for km in (running_km, queued_km):
            await km.shutdown_kernel(now=True)

        async def gone():
            return not (await _kernel_pods(api, namespace, running_id) + await _kernel_pods(api, namespace, queued_id))
        await until(gone, what="both kernels' pods deleted")

    try:
        k8s_cluster.run(body, timeout=300)
    finally:
        for process in processes:
            process.kill()
            process.wait(10)
        end_kernels(service, running_id, queued_id)
        for blocker in blockers:  # the first, released in the test, answers 404 here
            service.call("DELETE", f"leases/{blocker['id']}?holder_gone=true", token=ROOT)
    wait_for(lambda: service.call("GET", "leases", token=ALICE).json()["leases"] == [], what="the kernels' leases ended")


@pytest.fixture
def jp_server_config(service, server, monkeypatch):
    """alice's server as the hub starts it on Kubernetes: remote mode, the service's URL and her token."""
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", server.partition(":")[2])
    return {"ServerApp": {"jpserver_extensions": {"jupyter_gpualloc.server": True}},
            "GpuAllocExtension": {"mode": "remote", "service_url": service.root_url, "service_token": ALICE,
                                  "report_interval": 0.5, "kernel_wait_timeout": 120}}


async def _execute(ws, code: str) -> str:
    """Run `code` over a kernel's websocket (jupyter_server's JSON protocol); its stream output."""
    msg_id = uuid.uuid4().hex
    ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "alice", "session": "test",
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                    "allow_stdin": False}}))
    out: list[str] = []
    replied = idle = False  # the reply (shell) may come before the output (iopub): idle comes after it
    while not (replied and idle):
        msg = json.loads(await asyncio.wait_for(ws.read_message(), 60))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "execute_reply":
            assert msg["content"]["status"] == "ok", msg
            replied = True
        idle = idle or (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")
    return "".join(out)


async def test_gpu_request_restart_makes_a_cpu_kernel_a_gpu_kernel_in_a_pod_and_its_client_follows(
        jp_serverapp, http_server_client, jp_fetch, jp_ws_fetch, service, k8s_cluster, namespace, tmp_path):
    """`%gpu request ... --restart` in a CPU kernel of a real Jupyter server: the server restarts the
    kernel into a pod with the slice; the client's websocket is closed once it runs there, and
    reconnected with the same session it reaches the kernel in its pod."""
    await jp_serverapp.extension_manager.start_all_extensions()
    started = json.loads((await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))).body)
    kernel_id, session = started["id"], uuid.uuid4().hex
    km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    ports_before = km.ports
    ws = await jp_ws_fetch("api", "kernels", kernel_id, "channels", params={"session_id": session})
    process = None
    try:
        assert (await _execute(ws, "x = 41\nprint(x + 1)")).strip() == "42"
        refused = await _execute(ws, "%gpu request --mig 1g.10gb")
        assert "add --restart to %gpu request" in refused, refused
        said = await _execute(ws, "%gpu request --mig 1g.10gb --restart")
        assert "restarting this kernel as a GPU kernel (1g.10gb" in said and "variables are lost" in said, said
        _, process = await asyncio.to_thread(k8s_cluster.run, lambda api: play_the_kubelet(
            api, namespace, kernel_id, tmp_path / "kernel.log"), 120)
        states = []
        while (message := await asyncio.wait_for(ws.read_message(), 90)) is not None:  # closed once it runs
            msg = json.loads(message)
            if msg["msg_type"] == "status":
                states.append(msg["content"]["execution_state"])
        assert "restarting" in states, states
        assert km.provisioner.in_pod and km.ports != ports_before  # fresh ports: the channels are opened anew
        ws = await jp_ws_fetch("api", "kernels", kernel_id, "channels", params={"session_id": session})
        out = await _execute(ws, "import os\nprint(os.environ['GPUALLOC_SLICE_KIND'], 'x' in dir(), "
                                 "'GPUALLOC_EVENTS_URL' in os.environ)")
        assert out.split() == ["mig", "False", "False"], out  # a new kernel in its pod, its variables gone;
        # it follows the service's events itself (the server's relay is on the server pod's loopback)
        again = await _execute(ws, "%gpu request --mig 1g.10gb --restart")
        assert "a GPU kernel in a pod of its own already" in again, again
    finally:
        ws.close()
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")
        if process is not None:
            process.kill()
            process.wait(10)
    pods = await asyncio.to_thread(k8s_cluster.run, lambda api: until(
        lambda: _no_pods(api, namespace, kernel_id), what="the kernel's pod deleted"))
    assert pods
    assert not [l for l in service.call("GET", "leases", token=ALICE).json()["leases"]
                if l["holder"] == f"kernel:{kernel_id}"]


async def _no_pods(api, namespace: str, kernel_id: str) -> bool:
    return not await _kernel_pods(api, namespace, kernel_id)


async def test_the_sidebar_asks_before_a_restart_and_never_gets_a_slice_a_running_pod_cannot_use(
        jp_serverapp, http_server_client, jp_fetch, service):
    from tornado.httpclient import HTTPClientError

    await jp_serverapp.extension_manager.start_all_extensions()
    kernel_id = json.loads((await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))).body)["id"]
    try:
        async def refused(body: dict) -> tuple[int, str]:
            with pytest.raises(HTTPClientError) as err:
                await jp_fetch("gpualloc", "api", "request", method="POST", body=json.dumps(body))
            return err.value.code, json.loads(err.value.response.body)["message"]

        code, why = await refused({"spec": {"kind": "mig", "profile": "1g.10gb"}, "kernel_id": kernel_id})
        assert code == 409 and "confirm a restart as a GPU kernel" in why, why
        code, why = await refused({"spec": {"kind": "mig", "profile": "1g.10gb"}})
        assert code == 409 and "your running server cannot gain a GPU here" in why, why
        code, why = await refused({"spec": {"kind": "mig", "profile": "1g.10gb"}, "restart": True})
        assert code == 400 and "restart needs a kernel_id" in why, why
        code, why = await refused({"spec": {"kind": "mig"}, "kernel_id": kernel_id, "restart": "yes"})
        assert code == 400 and "restart must be true or false" in why, why
        code, _ = await refused({"spec": {"kind": "mig"}, "kernel_id": "no-such-kernel", "restart": True})
        assert code == 404
        assert not service.call("GET", "leases", token=ALICE).json()["leases"]  # nothing was asked of the service
    finally:
        await jp_fetch("api", "kernels", kernel_id, method="DELETE")


async def test_the_kernels_restart_path_takes_only_the_kernels_token_and_a_valid_spec(
        jp_serverapp, http_server_client):
    from tornado.httpclient import AsyncHTTPClient, HTTPClientError

    from jupyter_gpualloc.server.relay import RELAY_ROOT

    await jp_serverapp.extension_manager.start_all_extensions()
    ext = jp_serverapp.extension_manager.extensions["jupyter_gpualloc.server"].extension_points["gpualloc"].app
    url = ext.url_for_kernels(RELAY_ROOT) + "api/v1/kernels/k1/restart"

    async def post(body: dict, token: str) -> tuple[int, dict]:
        try:
            reply = await AsyncHTTPClient().fetch(url, method="POST", body=json.dumps(body),
                                                  headers={"Authorization": f"token {token}"})
        except HTTPClientError as err:
            return err.code, json.loads(err.response.body)
        return reply.code, json.loads(reply.body)

    assert (await post({"spec": {"kind": "mig", "profile": "1g.10gb"}}, BOB))[0] == 401
    code, body = await post({"spec": "big"}, ALICE)
    assert code == 400 and body["field"] == "spec", body
    code, body = await post({"spec": {"kind": "nonsense"}}, ALICE)
    assert code == 400 and body["field"].startswith("spec."), body
    code, body = await post({"spec": {"kind": "mig", "profile": "1g.10gb"}}, ALICE)
    assert code == 404 and body["field"] == "kernel_id", body


async def test_idle_release_and_preemption_end_a_kernels_pod_and_the_server_shuts_the_kernel_down(
        jp_serverapp, http_server_client, jp_kernel_dir, service, k8s_cluster, namespace, tmp_path):
    """The scheduler takes a pod kernel's slice back (idle, then preempted): the lease's end deletes the
    pod, and the server's monitor shuts the kernel down; it is not started again into a new slice."""
    from jupyter_gpualloc.server.kernelspecs import kernelspecs_for_offers

    specs = kernelspecs_for_offers([{"name": "idle", "spec": MIG_1G}, {"name": "batch", "spec": MIG_1G}])
    for name, config in (("idle", {"idle_timeout": 3}), ("batch", {"priority": "batch"})):
        # a spec of their own (the service offers no "idle" or "batch"); the idle kernel asks for a shorter timeout
        stanza = specs[f"gpualloc-{name}"]["metadata"]["kernel_provisioner"]["config"]
        del stanza["offer"]
        stanza.update(config)
    for name, spec in specs.items():
        (jp_kernel_dir / name).mkdir(parents=True)
        (jp_kernel_dir / name / "kernel.json").write_text(json.dumps(spec))
    await jp_serverapp.extension_manager.start_all_extensions()
    kernels = jp_serverapp.kernel_manager
    processes, blockers = [], []

    async def start(name: str) -> tuple[str, str]:
        kernel_id = str(uuid.uuid4())
        started = asyncio.ensure_future(kernels.start_kernel(kernel_name=name, kernel_id=kernel_id))
        _, process = await asyncio.to_thread(k8s_cluster.run, lambda api: play_the_kubelet(
            api, namespace, kernel_id, tmp_path / f"{name}.log"), 120)
        processes.append(process)
        await asyncio.wait_for(started, 60)
        return kernel_id, kernels.get_kernel(kernel_id).provisioner.lease_id

    async def ended(kernel_id: str, lease_id: str, state: str) -> None:
        async def over():
            lease = (await asyncio.to_thread(service.call, "GET", f"leases/{lease_id}", None, ALICE)).json()
            return lease["state"] == state and kernel_id not in kernels and await asyncio.to_thread(
                k8s_cluster.run, lambda api: _no_pods(api, namespace, kernel_id))
        await until(over, timeout=60, what=f"the kernel's lease {state}, its pod gone, the kernel shut down")
        mine = (await asyncio.to_thread(service.call, "GET", "leases", None, ALICE)).json()["leases"]
        assert not [l for l in mine if l["holder"] == f"kernel:{kernel_id}"], mine  # not started again

    try:
        idle_id, idle_lease = await start("gpualloc-idle")
        await ended(idle_id, idle_lease, "expired")

        for i in range(3):  # the node's other 1g.10gb instances
            reply = await asyncio.to_thread(service.call, "POST", "leases",
                                            {"spec": MIG_1G, "holder": f"server:p{i}"}, ROOT)
            blockers.append(reply.json())
        batch_id, batch_lease = await start("gpualloc-batch")
        reply = await asyncio.to_thread(service.call, "POST", "leases",
                                        {"spec": MIG_1G, "holder": "server:p3"}, ROOT)
        blockers.append(reply.json())
        assert blockers[-1]["state"] == "queued", blockers[-1]
        await ended(batch_id, batch_lease, "preempted")
    finally:
        for process in processes:
            process.kill()
            process.wait(10)
        for blocker in blockers:
            if "id" in blocker:
                service.call("DELETE", f"leases/{blocker['id']}?holder_gone=true", token=ROOT)
