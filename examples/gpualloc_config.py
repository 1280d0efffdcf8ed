# Configuration of `jupyter-gpualloc serve` (load it with `-f gpualloc_config.py`; a file of this
# name in the working directory is loaded by default). `jupyter-gpualloc serve --help-all` lists
# every option with its help text. Command-line options override what is set here.
c = get_config()  # noqa: F821  (provided by traitlets when the file is loaded)

# ---------------------------------------------------------------- where GPUs come from
# simulated (a fleet file), nvml (this host's NVIDIA GPUs) or kubernetes (the cluster's nodes).
# Default: simulated when a fleet is given, else nvml.
c.GpuAllocService.backend = "simulated"
c.GpuAllocService.fleet = "examples/fleets/demo.yaml"

# ---------------------------------------------------------------- state and audit
# Every lease, queue position and MIG instance is stored here before it is announced, so the
# service can be killed and restarted without losing a lease or a queue position.
c.GpuAllocService.db_url = "sqlite:///gpualloc.sqlite"
# Every scheduler event, one JSON object per line (empty string: no audit log).
c.GpuAllocService.audit_log = "gpualloc-audit.jsonl"

# ---------------------------------------------------------------- HTTP
# Standalone: listen here. As a JupyterHub managed service, ip/port/base_url come from
# JUPYTERHUB_SERVICE_URL and JUPYTERHUB_SERVICE_PREFIX and need not be set.
c.GpuAllocService.ip = "127.0.0.1"
c.GpuAllocService.port = 8765
c.GpuAllocService.max_wait = 60        # longest POST /leases long-poll, seconds
c.GpuAllocService.tick_interval = 5    # seconds between expiry/grant passes
c.GpuAllocService.retry_after = 30     # Retry-After of 503 answers (drained fleet)

# ---------------------------------------------------------------- who may call
# Standalone mode: bearer tokens. Generate them with e.g. `openssl rand -hex 32`.
# `admin: True` may list and release every lease, drain GPUs and read /metrics.
# `groups` feed the group quotas below.
c.GpuAllocService.api_tokens = {
    "replace-with-a-long-random-token-for-alice": {"user": "alice", "groups": ["students"]},
    "replace-with-a-long-random-token-for-ops": {"user": "ops", "admin": True},
}
# JupyterHub mode (auto when JUPYTERHUB_API_TOKEN is set): users authenticate with their hub
# token, their single-user server's token or the service's OAuth cookie; administrators are the
# holders of this custom scope. In jupyterhub_config.py:
#   c.JupyterHub.custom_scopes = {"custom:gpualloc:admin": {"description": "Administer GPU slices"}}
#   c.JupyterHub.load_roles = [
#       {"name": "user", "scopes": ["self", "access:services!service=gpualloc"]},
#       {"name": "server", "scopes": ["users:activity!user", "access:servers!server",
#                                     "access:services!service=gpualloc"]},
#       {"name": "gpualloc-admin", "scopes": ["custom:gpualloc:admin"], "users": ["ops"]},
#   ]
#   c.JupyterHub.services = [{"name": "gpualloc", "url": "http://127.0.0.1:8765",
#                             "command": ["jupyter-gpualloc", "serve", "-f", "/etc/gpualloc/gpualloc_config.py"],
#                             "oauth_no_confirm": True}]
c.GpuAllocService.admin_scope = "custom:gpualloc:admin"
c.GpuAllocService.authenticate_prometheus = True   # /metrics needs an admin token

# ---------------------------------------------------------------- policy (the scheduler core)
c.SchedulerPolicy.placement = "default"            # fragmentation-aware placement of shares
c.SchedulerPolicy.idle_timeout = 1800              # kernel leases: warn after 30 idle minutes...
c.SchedulerPolicy.idle_grace = 300                 # ...and release 5 minutes later
c.SchedulerPolicy.heartbeat_ttl = 120              # a silent holder loses its lease after 2 minutes
c.SchedulerPolicy.quotas = {"*": {"slices": 2, "memory_gib": 80}, "ops": {}}
c.SchedulerPolicy.group_quotas = {"students": {"memory_gib": 160}}
c.SchedulerPolicy.preempt_grace = 60               # a preempted job: SIGINT, SIGTERM 60 s later, then SIGKILL
c.SchedulerPolicy.requeue_interrupted = True       # a job whose server died runs again (False: it fails)
c.SchedulerPolicy.interactive_jobs = False         # jobs stay in the batch class
c.SchedulerPolicy.allow_non_preemptible = False    # a job's --no-preemptible is refused: batch work is preemptible
c.SchedulerPolicy.max_job_retries = 10             # the most --retries a job may ask for
# A request names an offer (or a spec, mapped to the offer whose spec it is); its lease gets the
# offer's idle_timeout and max_duration (else the policy's), and may only ask for a shorter idle
# timeout. "groups" limits an offer to members of those groups.
c.SchedulerPolicy.offers = [
    {"name": "small", "label": "MIG 1g.10gb (A100)", "spec": {"kind": "mig", "profile": "1g.10gb"}},
    {"name": "medium", "label": "MIG 3g.40gb (A100)", "spec": {"kind": "mig", "profile": "3g.40gb"}},
    {"name": "shared-16", "label": "16 GiB of an H100", "spec": {"kind": "shared", "memory_gib": 16,
                                                               "model": "H100 80GB HBM3"}},
    {"name": "whole-l4", "label": "A whole L4", "spec": {"kind": "whole", "model": "L4"},
     "idle_timeout": 3600, "max_duration": 4 * 3600, "groups": ["staff"]},
]
# The standalone service serves a job's log only from a workdir under these (for users with a
# local account other than the service's own); {home} and {user} are that account's.
c.GpuAllocService.job_workdir_roots = ["{home}"]
