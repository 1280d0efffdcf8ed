"""REST API v1 for background jobs: thin handlers over the core's `Jobs`.

A user sees and acts on their own jobs only (another user's job is answered as if it did not
exist, 404); the admin scope sees and cancels every job. `start` and `finish` are the runner's
calls: the runner of the job's server (`runner`) claims it once its slice is granted and reports
how each attempt ended, and says when it stops (`runners/gone`: its jobs then wait for it, see
core/jobs.py). With jobs in Kubernetes Jobs (service/job_pods.py) a submit copies the
submitting server's pod into the job, and the runner is the one in the job's pod.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from tornado.iostream import StreamClosedError

from ..core.jobs import OUTCOMES, JobConflict, JobRequest, Jobs
from ..core.model import Job
from ..core.errors import NotFound
from ..job_folder import JobFolder
from ..user_files import Refused, opened_owned, owner_uid, read_at, root_of, workdir_roots
from .handlers import ApiError, ApiHandler, _reject_unknown

LOG_POLL_SECONDS = 0.5
LOG_CHUNK_BYTES = 64 * 1024
FINISH_FIELDS = {"attempt", "outcome", "reason"}


class JobApiHandler(ApiHandler):
    """Base of the job handlers: the caller's jobs only, core conflicts as 409."""

    @property
    def jobs(self) -> Jobs:
        return self.ctx.jobs

    def visible_job(self, job_id: str) -> Job:
        try:
            job = self.jobs.job(job_id)
        except NotFound:
            job = None
        if job is None or (job.user != self.identity.user and not self.identity.admin):
            raise ApiError(404, f"no job {job_id}")
        return job

    def job_json(self, job: Job) -> dict[str, Any]:
        return self.jobs.view(job, self.ctx.clock())

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, JobConflict):
            kwargs["exc_info"] = (ApiError, ApiError(409, str(exc), state=exc.state), None)
        super().write_error(status_code, **kwargs)

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, JobConflict):
            self.log_request_error(ApiError(409, str(value)))
        else:
            super().log_exception(typ, value, tb)


class JobsHandler(JobApiHandler):
    def get(self) -> None:
        everyone = self.get_query_argument("all", "0") not in ("0", "", "false")
        if everyone:
            self.require_admin()
        jobs = self.jobs.jobs(None if everyone else self.identity.user)
        self.write_json({"jobs": [self.job_json(j) for j in jobs]})

    def post(self) -> None:
        request = JobRequest.from_json(self.json_body())
        roots = workdir_roots(self.identity.user, self.ctx.job_workdir_roots)
        if roots is not None and root_of(request.workdir, roots) is None:
            raise ApiError(400, f"workdir must lie in {' or '.join(roots) or 'a configured root'}", field="workdir")
        pod = None
        if self.ctx.job_pods is not None:
            request, pod = self.ctx.job_pods.submission(self.identity.user, request)
        with self.ctx.metrics.timed("job_submit"):
            job = self.jobs.submit(self.identity.user, request, now=self.ctx.clock(), groups=self.identity.groups,
                                   pod=pod)
        self.set_header("Location", self.reverse_url("job", job.id))
        self.write_json(self.job_json(job), 201)


class JobHandler(JobApiHandler):
    def get(self, job_id: str) -> None:
        self.write_json(self.job_json(self.visible_job(job_id)))

    def delete(self, job_id: str) -> None:
        self.visible_job(job_id)
        job = self.jobs.cancel(job_id, now=self.ctx.clock(), by=self.identity.user)
        self.write_json(self.job_json(job))


class JobRerunHandler(JobApiHandler):
    def post(self, job_id: str) -> None:
        self.visible_job(job_id)
        job = self.jobs.rerun(job_id, now=self.ctx.clock())
        self.set_header("Location", self.reverse_url("job", job.id))
        self.write_json(self.job_json(job), 201)


class JobStartHandler(JobApiHandler):
    def post(self, job_id: str) -> None:
        self.visible_job(job_id)
        runner = self.json_body().get("runner", "server")
        job = self.jobs.start(job_id, now=self.ctx.clock(), runner=runner)
        self.write_json(self.job_json(job))


class JobFinishHandler(JobApiHandler):
    def post(self, job_id: str) -> None:
        self.visible_job(job_id)
        body = self.json_body()
        _reject_unknown(body, FINISH_FIELDS)
        attempt = body.get("attempt")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise ApiError(400, "attempt must be a positive integer", field="attempt")
        outcome = body.get("outcome")
        if outcome not in OUTCOMES:
            raise ApiError(400, f"outcome must be one of {', '.join(OUTCOMES)}", field="outcome")
        reason = body.get("reason", "")
        if not isinstance(reason, str):
            raise ApiError(400, "reason must be a string", field="reason")
        job = self.jobs.finish(job_id, attempt, outcome, reason[:2000], now=self.ctx.clock())
        self.write_json(self.job_json(job))


class RunnerGoneHandler(JobApiHandler):
    def post(self) -> None:
        """The runner of the caller's server stopped: its jobs wait for it (no slice, no quota) until it is back."""
        runner = self.json_body().get("runner", "server")
        jobs = self.jobs.runner_gone(self.identity.user, runner, now=self.ctx.clock())
        self.write_json({"jobs": [self.job_json(j) for j in jobs]})


class JobLogHandler(JobApiHandler):
    """The job's log as text, as far as it reached when the request began; with ?follow=1 what it
    gains is streamed until the job has ended.

    The file is opened as user_files.open_owned says (no link followed on its path, a regular
    file of the job's user with one link), read in user_files' threads, and re-opened and
    checked again at each round of a follow. A log not written yet is empty; one refused is a
    403 (a refusal met after text was sent ends the stream with a line saying why)."""

    async def get(self, job_id: str) -> None:
        job = self.visible_job(job_id)
        follow = self.get_query_argument("follow", "0") not in ("0", "", "false")
        path = str(JobFolder(job.workdir, job.id).log)
        owner = owner_uid(job.user)
        trusted = root_of(job.workdir, workdir_roots(job.user, self.ctx.job_workdir_roots) or []) or "/"
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        offset = 0
        try:
            while True:
                offset = await self._send_new(path, owner, trusted, offset)
                job = self.jobs.job(job_id)
                if not follow or not job.state.active:
                    if follow:
                        offset = await self._send_new(path, owner, trusted, offset)
                    break
                await asyncio.sleep(LOG_POLL_SECONDS)
        except Refused as err:
            if offset == 0:  # nothing sent yet: the status can still say it
                raise ApiError(403, f"the log of job {job_id} is not served: {err}") from None
            self.write(f"\n(the log stopped: {err})\n")
        except StreamClosedError:
            return
        self.finish()

    async def _send_new(self, path: str, owner: int, trusted: str, offset: int) -> int:
        """Write what the log gained since `offset`, up to its size now; the new offset."""
        try:
            fd, size = await opened_owned(path, owner, trusted)
        except FileNotFoundError:
            return offset
        except OSError as err:  # the service's account may not read it; a name too long; ...
            raise Refused(f"the service cannot open it ({err.strerror})") from None
        try:
            while offset < size and (chunk := await read_at(fd, offset, min(LOG_CHUNK_BYTES, size - offset))):
                self.write(chunk)
                offset += len(chunk)
                await self.flush()
        finally:
            os.close(fd)
        return offset


# (path template under <prefix>api/v1, handler, route name): appended to the service's ROUTES
JOB_ROUTES: list[tuple[str, type[ApiHandler], str]] = [
    ("/jobs", JobsHandler, "jobs"),
    ("/jobs/runners/gone", RunnerGoneHandler, "jobs_runner_gone"),
    ("/jobs/{job_id}", JobHandler, "job"),
    ("/jobs/{job_id}/log", JobLogHandler, "job_log"),
    ("/jobs/{job_id}/rerun", JobRerunHandler, "job_rerun"),
    ("/jobs/{job_id}/start", JobStartHandler, "job_start"),
    ("/jobs/{job_id}/finish", JobFinishHandler, "job_finish"),
]
