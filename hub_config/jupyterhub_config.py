# JupyterHub on GPU slices: the local demo (`jupyterhub -f hub_config/jupyterhub_config.py`).
#
# - Any user name logs in, with any password (DummyAuthenticator); alice, bob and carol are the
#   demo users, `admin` is a JupyterHub admin and an administrator of the allocator.
# - Every server runs as this OS user, with its own home under <runtime>/users/ (GPUSameUserSpawner).
# - The scheduler is a managed service, /services/gpualloc/: NVML's GPUs when it finds any, else
#   the simulated fleet of demo-fleet.yaml (two MIG A100-80GB, an H100 shared by memory caps, an L4).
#
# Environment (all optional): GPUALLOC_DEMO_DIR (runtime directory: databases, logs, homes;
# default: the current directory), GPUALLOC_DEMO_IP / GPUALLOC_DEMO_PORT (127.0.0.1:8000),
# GPUALLOC_DEMO_HUB_PORT (8081), GPUALLOC_DEMO_PROXY_API_PORT (8001), GPUALLOC_DEMO_SERVICE_PORT
# (8765) — the four must differ; `jupyter-gpualloc demo` moves an internal one left unset that is
# in use —, GPUALLOC_DEMO_FLEET (use this fleet file, skipping NVML), GPUALLOC_DEMO_SERVICE_CONFIG
# (a file appended to the service's gpualloc_config.py), GPUALLOC_DEMO_EXTRA_CONFIG (a file
# loaded after this one).
import os
import sys
from pathlib import Path

from jupyter_gpualloc.hub.demo import PortError, configured_ports

c = get_config()  # noqa: F821

HERE = Path(__file__).resolve().parent
RUNTIME = Path(os.environ.get("GPUALLOC_DEMO_DIR") or Path.cwd()).resolve()
BIN = Path(sys.executable).parent
IP = os.environ.get("GPUALLOC_DEMO_IP", "127.0.0.1")
try:
    PORTS = configured_ports(os.environ)
except PortError as err:
    sys.exit(f"[gpualloc demo] error: {err}")
PORT, HUB_PORT = PORTS["GPUALLOC_DEMO_PORT"], PORTS["GPUALLOC_DEMO_HUB_PORT"]
PROXY_API_PORT, SERVICE_PORT = PORTS["GPUALLOC_DEMO_PROXY_API_PORT"], PORTS["GPUALLOC_DEMO_SERVICE_PORT"]
DEMO_USERS = ["alice", "bob", "carol"]
ADMIN_USER = "admin"
SERVICE = "gpualloc"
ACCESS = f"access:services!service={SERVICE}"


def gpu_source():
    """('nvml', None) when NVML finds GPUs here, else ('simulated', the demo fleet file)."""
    forced = os.environ.get("GPUALLOC_DEMO_FLEET")
    if forced:
        return "simulated", Path(forced).resolve(), "the fleet file given in GPUALLOC_DEMO_FLEET"
    from jupyter_gpualloc.core.devices import DeviceError, NvmlBackend

    try:
        backend = NvmlBackend()
    except DeviceError as err:
        reason = str(err).splitlines()[0].split(" No GPU here?")[0]  # not its hint: the demo follows it
        return "simulated", HERE / "demo-fleet.yaml", f"no NVML GPUs here ({reason})"
    try:
        gpus = sum(len(node.gpus) for node in backend.discover())
    finally:
        backend.close()
    if not gpus:
        return "simulated", HERE / "demo-fleet.yaml", "NVML lists no GPU"
    return "nvml", None, f"NVML finds {gpus} GPU(s)"


BACKEND, FLEET, WHY = gpu_source()
print(f"[gpualloc demo] GPUs: {'the simulated demo fleet' if FLEET else 'this machine (NVML)'} "
      f"{'(' + str(FLEET) + ')' if FLEET else ''}: {WHY}", file=sys.stderr, flush=True)

# ------------------------------------------------------------------ the hub
RUNTIME.mkdir(parents=True, exist_ok=True)
c.JupyterHub.ip = IP
c.JupyterHub.port = PORT
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = HUB_PORT
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PROXY_API_PORT}"
c.ConfigurableHTTPProxy.pid_file = str(RUNTIME / "jupyterhub-proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{RUNTIME / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(RUNTIME / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(RUNTIME / "jupyterhub.pid")
# Servers (and their GPU leases) outlive a hub restart; the spawner resumes their heartbeats.
c.JupyterHub.cleanup_servers = False

c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {ADMIN_USER}

# ------------------------------------------------------------ the spawner
c.JupyterHub.spawner_class = "jupyter_gpualloc.hub.GPUSameUserSpawner"
c.GPUSameUserSpawner.home_dir_template = str(RUNTIME / "users" / "{username}")
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
if os.geteuid() == 0:
    c.Spawner.args = ["--allow-root"]
try:
    import jupyterlab  # noqa: F401

    c.Spawner.default_url = "/lab"
except ImportError:
    pass
# A start may wait in the GPU queue for start_timeout less gpu_start_reserve (585 s); the progress
# page says when it gives up (the README's dave waits for bob's Whole H100)
c.Spawner.start_timeout = 600
c.Spawner.http_timeout = 60
c.GPUSpawnerMixin.gpu_heartbeat_interval = 20

# ------------------------------------------------------------ the service
service_dir = RUNTIME / "gpualloc"
service_dir.mkdir(exist_ok=True)
policy = f"""# Written by {Path(__file__).name} at each hub start.
c.SchedulerPolicy.heartbeat_ttl = 90
c.SchedulerPolicy.quotas = {{"*": {{"slices": 2, "whole_gpus": 1}}, "carol": {{"slices": 1, "memory_gib": 20}}}}
"""
if FLEET is not None and FLEET.resolve() == (HERE / "demo-fleet.yaml").resolve():
    policy += """c.SchedulerPolicy.offers = [
    {"name": "mig-1g.10gb", "label": "MIG 1g.10gb on A100 80GB", "spec": {"kind": "mig", "profile": "1g.10gb"}},
    {"name": "mig-2g.20gb", "label": "MIG 2g.20gb on A100 80GB", "spec": {"kind": "mig", "profile": "2g.20gb"}},
    {"name": "mig-3g.40gb", "label": "MIG 3g.40gb on A100 80GB", "spec": {"kind": "mig", "profile": "3g.40gb"}},
    {"name": "shared-8gb-h100", "label": "Shared 8 GiB on H100",
     "spec": {"kind": "shared", "memory_gib": 8, "model": "H100 80GB HBM3"}},
    {"name": "shared-8gb-l4", "label": "Shared 8 GiB on L4", "spec": {"kind": "shared", "memory_gib": 8, "model": "L4"}},
    {"name": "whole-h100", "label": "Whole H100", "spec": {"kind": "whole", "model": "H100 80GB HBM3"}},
    {"name": "whole-l4", "label": "Whole L4", "spec": {"kind": "whole", "model": "L4"}},
]
"""
extra_service_config = os.environ.get("GPUALLOC_DEMO_SERVICE_CONFIG")
if extra_service_config:
    policy += Path(extra_service_config).read_text()
(service_dir / "gpualloc_config.py").write_text(policy)

serve = [sys.executable, "-m", "jupyter_gpualloc.cli", "serve", "-f", str(service_dir / "gpualloc_config.py"),
         "--db", f"sqlite:///{service_dir / 'gpualloc.sqlite'}", "--audit-log", str(service_dir / "audit.jsonl")]
serve += ["--fleet", str(FLEET)] if FLEET is not None else ["--backend", "nvml"]
c.JupyterHub.services = [{
    "name": SERVICE,
    "url": f"http://127.0.0.1:{SERVICE_PORT}",
    "command": serve,
    "cwd": str(service_dir),
    "oauth_no_confirm": True,
    # A browser's OAuth token for the service may carry the admin scope (for users who hold it),
    # so an admin sees every lease and holder, and gets the admin's actions, on the service's page
    # (/services/gpualloc/, in the menu bar's Services) and at /services/gpualloc/api/v1/... in a browser.
    "oauth_client_allowed_scopes": ["custom:gpualloc:admin"],
    "display": True,
}]

# ---------------------------------------------------------------- roles
c.JupyterHub.custom_scopes = {
    "custom:gpualloc:admin": {"description": "Administer the GPU allocator: every lease, drain GPUs, metrics."},
}
c.JupyterHub.load_roles = [
    # Users (their browser, and the token the spawner makes for them) may use the service.
    {"name": "user", "scopes": ["self", ACCESS]},
    # A server's token (JUPYTERHUB_API_TOKEN, also its kernels'): activity, plus the service.
    {"name": "server", "scopes": ["users:activity!user", "access:servers!server", ACCESS]},
    {"name": "gpualloc-admin", "scopes": ["custom:gpualloc:admin", ACCESS], "users": [ADMIN_USER]},
]

# `jupyter-gpualloc demo` stops the servers through the API before it stops the hub, so their
# leases are released while the allocator still runs (the hub stops its services first).
if os.environ.get("GPUALLOC_DEMO_STOP_TOKEN"):
    c.JupyterHub.services.append({"name": "demo-launcher", "api_token": os.environ["GPUALLOC_DEMO_STOP_TOKEN"]})
    c.JupyterHub.load_roles.append({"name": "demo-launcher", "services": ["demo-launcher"],
                                    "scopes": ["list:users", "read:servers", "servers"]})

extra = os.environ.get("GPUALLOC_DEMO_EXTRA_CONFIG")
if extra:
    load_subconfig(extra)  # noqa: F821
