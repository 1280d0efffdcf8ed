"""Background jobs as Kubernetes Jobs: each granted attempt runs in a `batch/v1` Job of its own.

A running pod cannot gain a device, so on Kubernetes a job does not run in its owner's server pod.
When `c.GpuAllocService.job_pods` is on:

- At submit the service copies the submitting server's pod (service/user_pods.py) into the job's
  record (runner 'pod'), so a job queued now still starts after its owner's server stopped. With
  ReadWriteOnce homes (`c.UserPods.home_access_mode`) the job's slice is asked for on that server's
  node, where its home mounts, as a GPU kernel's is; a submit naming another node is refused.
- Once the job's lease is granted, the service creates a Job from that copy, with the lease's GPU
  resources, node affinity to the lease's node, the GPU tolerations, `backoffLimit: 0` (retries
  are the core's), `ttlSecondsAfterFinished`, `terminationGracePeriodSeconds = preempt_grace`, no
  service-account token, and the labels of the lease and the job. Its container runs
  `jupyter-gpualloc job run <id>` (jobs/runner.py), which calls the service with a token made for
  this attempt: its SHA-256 is kept in the job's record, the token in a Secret owned by the Job
  (named anew for each token: the service creates Secrets, never updates or reads one).
- When the lease ends (the runner reported, cancel, preemption, expiry) the Job is deleted with its
  pod (SIGTERM, then SIGKILL after the grace) and Secret.
- A pod that ends or goes without the runner's report is a failed attempt with the kubelet's reason
  (OOMKilled, Evicted, its pod was deleted, ...): the reconciler (service/cluster.py) says so here.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
from dataclasses import replace
from typing import Any, Callable, Mapping

from traitlets import Int, List, Unicode
from traitlets.config import LoggingConfigurable

from ..core.devices.kubernetes import JOB_LABEL, OwnPod
from ..core.errors import NotFound, SchedulerError, StoreFailed
from ..core.holders import job_of
from ..core.jobs import POD_RUNNER, JobRequest, Jobs
from ..core.model import Event, Job, JobState, LeaseState, SpecError
from .auth import job_token
from .dra_claims import ClaimError, LeaseClaims
from .user_pods import UserPods, api_message

log = logging.getLogger(__name__)

TOKEN_KEY = "token"


class JobPods(LoggingConfigurable):
    """Creates and deletes the Kubernetes Jobs of the jobs whose runner is 'pod' (see the module)."""

    service_url = Unicode(
        "", help="""The URL at which a job's pod reaches this service's API, e.g.
        http://hub:8081/services/gpualloc/ in zero-to-jupyterhub. Empty: the GPUALLOC_URL of the
        submitting server's pod.""",
    ).tag(config=True)
    command = List(
        ["jupyter-gpualloc", "job", "run"],
        help="The runner's command in a job's pod (the server's image); the job's id is appended.",
    ).tag(config=True)
    ttl_seconds_after_finished = Int(
        3600, help="""Seconds a finished Job is kept by Kubernetes (ttlSecondsAfterFinished) when the
        service did not delete it itself (it was down when the lease ended).""",
    ).tag(config=True)
    def __init__(self, jobs: Jobs, watch: Any, pods: UserPods, *, clock: Callable[[], float],
                 claims: LeaseClaims | None = None, **kwargs: Any):
        """`claims`: the leases' ResourceClaims on DRA nodes (None: no claims are written)."""
        super().__init__(**kwargs)
        self.jobs, self.scheduler, self.watch, self.pods, self.clock = jobs, jobs.scheduler, watch, pods, clock
        self.claims = claims
        self._creating: set[str] = set()  # leases whose Job is being created
        self._made: set[str] = set()  # leases whose Job exists (made or found)
        self._tasks: set[asyncio.Task] = set()
        self.scheduler.subscribe(self._on_event)

    # ------------------------------------------------------------- at submit
    def submission(self, user: str, request: JobRequest) -> tuple[JobRequest, dict[str, Any]]:
        """`request` as its pod may run it (with ReadWriteOnce homes, pinned to the submitting server's
        node), and what its pod takes from that server's pod (NoServerPod where none runs)."""
        template = self.pods.server_template(self.watch.pods(), user, request.runner, self.watch.namespace)
        return replace(request, spec=self.pods.placed(request.spec, template, "job")), template

    # ------------------------------------------------------------ the leases
    def tick(self) -> None:
        """Create the Jobs of granted pod jobs that have none (a creation that failed, or made while
        the service was down)."""
        for job in self.jobs.active():
            if job.runner == POD_RUNNER and job.state is JobState.QUEUED and job.lease_id:
                self._grant(job.lease_id)

    def _on_event(self, event: Event) -> None:
        job_id = job_of(event.data.get("holder"))
        if job_id is None or event.lease_id is None:
            return
        if event.type == "lease.granted":  # looked at once the change that granted it is over (a
            # job's first lease is granted inside its submit, before the job holds it)
            try:
                asyncio.get_running_loop().call_soon(self._grant, event.lease_id)
            except RuntimeError:  # no IOLoop: tick() makes it
                pass
        elif event.type in ("lease.released", "lease.expired", "lease.preempted", "lease.cancelled"):
            self._made.discard(event.lease_id)
            self._spawn(self._delete_job(job_id, event.lease_id))

    def _grant(self, lease_id: str) -> None:
        if lease_id in self._creating or lease_id in self._made:
            return
        try:
            lease = self.scheduler.lease(lease_id)
            job = self.jobs.job(job_of(lease.holder) or "")
        except (NotFound, StoreFailed):
            return
        if job.runner != POD_RUNNER or job.lease_id != lease_id or lease.state is not LeaseState.GRANTED:
            return
        if self.watch.own_pods_of(lease_id):
            self._made.add(lease_id)
            return
        self._creating.add(lease_id)
        self._spawn(self._create(job, lease.to_json()))

    def pod_ended(self, pod: OwnPod, why: str) -> None:
        """A job's pod ended or went: its attempt failed with `why` unless the runner reported first."""
        try:
            job = self.jobs.job(pod.job_id or "")
        except (NotFound, StoreFailed):
            return
        if job.runner != POD_RUNNER or job.lease_id != pod.lease_id or not job.state.active:
            return
        self._fail_attempt(job, why)

    def _fail_attempt(self, job: Job, why: str) -> None:
        """The attempt of `job` ended without the runner's report (or could not start): failed, with why."""
        now = self.clock()
        try:
            if job.state is JobState.QUEUED:
                job = self.jobs.start(job.id, now=now, runner=POD_RUNNER)
            self.jobs.finish(job.id, job.attempts, "failed", why, now=now)
        except (SchedulerError, SpecError, StoreFailed) as err:
            log.warning("job %s: cannot record its failed attempt (%s): %s", job.id, why, err)

    # ---------------------------------------------------------- Kubernetes
    async def _create(self, job: Job, lease: Mapping[str, Any]) -> None:
        """The attempt's token (its digest stored first), then the Job, suspended, then the Secret it
        owns, then the Job resumed: its pod is made only once its token's Secret exists, so a crash
        or a refusal in between leaves a Job with no pod, which is made again (below), never a pod
        whose Secret will not come.

        The Secret's name is new with each token, so it is only ever created (the service may not
        update or read Secrets). A Job of this attempt that exists already was made by an earlier
        run of the service (a restart, or a creation whose answer was lost) for a token no longer
        stored, and has no pod yet (the watch sees none): it is deleted, with its Secret, and the
        next tick makes the attempt's Job afresh."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        lease_id, namespace = lease["id"], (job.pod or {}).get("namespace", "default")
        token = job_token(job.id, secrets.token_urlsafe(32))
        try:
            self.jobs.set_token(job.id, hashlib.sha256(token.encode()).hexdigest())
            secret_name = f"{job_name(job.id, lease_id)}-{secrets.token_hex(4)}"
            try:
                claim = await self.claims.ensure(lease, namespace) if self.claims is not None else None
            except ClaimError as err:  # the API refused it: this attempt can never run
                self._fail_attempt(self.jobs.job(job.id), str(err))
                return
            manifest = self.job_manifest(job, lease, secret_name, claim)
            batch, core = client.BatchV1Api(self.watch.api_client), client.CoreV1Api(self.watch.api_client)
            try:
                made = await batch.create_namespaced_job(namespace, manifest, _request_timeout=30)
            except ApiException as err:
                if err.status != 409:
                    raise
                await self._delete_job(job.id, lease_id, "made before for a token no longer valid: "
                                                         "it is made again")
                return
            owner = {"apiVersion": "batch/v1", "kind": "Job", "name": manifest["metadata"]["name"],
                     "uid": made.metadata.uid, "controller": True, "blockOwnerDeletion": False}
            secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                      "metadata": {"name": secret_name, "namespace": namespace,
                                   "labels": manifest["metadata"]["labels"], "ownerReferences": [owner]},
                      "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()}}
            await core.create_namespaced_secret(namespace, secret, _request_timeout=30)
            await batch.patch_namespaced_job(manifest["metadata"]["name"], namespace, {"spec": {"suspend": False}},
                                             _request_timeout=30)
            self._made.add(lease_id)
            log.info("job %s: Kubernetes Job %s/%s created on node %s", job.id, namespace,
                     manifest["metadata"]["name"], lease["slice"]["node"])
        except ApiException as err:
            if err.status in (400, 403, 404, 422):  # this Job can never be made: the attempt fails
                self._fail_attempt(self.jobs.job(job.id), f"its Kubernetes Job could not be created: "
                                                          f"{err.status} {api_message(err)}")
            else:  # the API server is unreachable or busy: the next tick tries again
                log.warning("job %s: creating its Kubernetes Job failed, retrying: %s", job.id, err)
        except (SchedulerError, StoreFailed, OSError, asyncio.TimeoutError) as err:
            log.warning("job %s: creating its Kubernetes Job failed, retrying: %s", job.id, err)
        finally:
            self._creating.discard(lease_id)

    async def _delete_job(self, job_id: str, lease_id: str, why: str = "its lease ended") -> None:
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            job = self.jobs.job(job_id)
        except (NotFound, StoreFailed):
            return
        if job.runner != POD_RUNNER:
            return
        name, namespace = job_name(job_id, lease_id), (job.pod or {}).get("namespace", "default")
        try:
            await client.BatchV1Api(self.watch.api_client).delete_namespaced_job(
                name, namespace, propagation_policy="Background", _request_timeout=30)
            log.info("job %s: Kubernetes Job %s/%s deleted (%s)", job_id, namespace, name, why)
        except ApiException as err:
            if err.status != 404:
                log.warning("job %s: deleting Kubernetes Job %s failed: %s", job_id, name, err)
        except (OSError, asyncio.TimeoutError) as err:
            log.warning("job %s: deleting Kubernetes Job %s failed: %s", job_id, name, err)

    def _spawn(self, coroutine) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # the core driven without an IOLoop: tick() makes what is missing
            coroutine.close()
            return
        task = loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------ manifests
    def job_manifest(self, job: Job, lease: Mapping[str, Any], secret_name: str,
                     claim: str | None = None) -> dict[str, Any]:
        """The batch/v1 Job of one attempt of `job` on granted `lease`, its token in Secret `secret_name`;
        on a DRA node its pod uses the lease's claim `claim`. It is made suspended (no pod) and
        resumed once the Secret exists (`_create`)."""
        template = job.pod or {}
        name = job_name(job.id, lease["id"])
        labels = self.pods.labels(template, "job", **self.watch.pod_labels(lease["id"]), **{JOB_LABEL: job.id})
        env = [{"name": "GPUALLOC_JOB_ID", "value": job.id},
               {"name": "GPUALLOC_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret_name, "key": TOKEN_KEY}}}]
        pod_spec = self.pods.pod_spec(template, lease, container="job", command=[*self.command, job.id],
                                      working_dir=job.workdir, env=env, service_url=self.service_url,
                                      grace_seconds=int(self.jobs.policy.preempt_grace), claim=claim)
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": template.get("namespace", "default"), "labels": labels},
                "spec": {"suspend": True, "backoffLimit": 0, "ttlSecondsAfterFinished": self.ttl_seconds_after_finished,
                         "template": {"metadata": {"labels": labels, "annotations": dict(self.pods.pod_annotations)},
                                      "spec": pod_spec}}}


def job_name(job_id: str, lease_id: str) -> str:
    """The Kubernetes Job of the attempt of job `job_id` on lease `lease_id` (its Secret: this and a suffix)."""
    return f"gpualloc-job-{job_id}-{lease_id}".lower()


