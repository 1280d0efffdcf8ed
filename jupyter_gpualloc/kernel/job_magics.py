"""`%%gpu job` and `%gpu jobs` / `%gpu job logs|cancel|result|rerun ID`: a heavy cell as a background job.

`%%gpu job --mem 40GB --inputs data --outputs model` queues the cell at once: its inputs are
pickled (cloudpickle) from this kernel first, and a missing or unpicklable one is refused, naming
it, before anything is queued. The job runs in a fresh kernel in this notebook's directory, in
the user's Jupyter server; `%gpu job result ID` loads its declared outputs here. Every failure
prints one line to stderr, never a traceback.
"""

from __future__ import annotations

import os
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any, MutableMapping

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from ..job_folder import INPUTS_DIR, JobFolder
from ..user_files import Refused, read_regular
from .arguments import job_action_parser, job_submit_parser, spec_from_args
from .sizes import InputError, format_duration, parse_duration
from .status import describe_lease, error_line, is_reported, job_state_text, job_submitted_text

ACTIVE = ("queued", "running")
SERVER_NOTE = "jobs run inside your Jupyter server: stopping the server stops them"


def _names(text: str, option: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if not name.isidentifier():
            raise InputError(f"{option}: '{name}' is not a variable name")
    return names


def job_spec(args) -> dict[str, Any]:
    """The REST spec of `%%gpu job`'s slice options; InputError unless exactly one kind is given."""
    return spec_from_args(args.mem or "", args.mig, args.shared, args.whole, args.model)


def pickle_inputs(names: list[str], namespace: MutableMapping[str, Any]) -> bytes:
    """The inputs as one cloudpickle of {name: value}; InputError naming the first that is missing or unpicklable."""
    import cloudpickle

    values = {}
    for name in names:
        if name not in namespace:
            raise InputError(f"input '{name}' is not defined in this kernel: nothing was queued")
        try:
            cloudpickle.dumps(namespace[name])
        except Exception as err:
            raise InputError(f"input '{name}' cannot be pickled ({type(err).__name__}: {err}): "
                             "nothing was queued") from None
        values[name] = namespace[name]
    return cloudpickle.dumps(values)


def job_request(args, cell: str, namespace: MutableMapping[str, Any], workdir: Path) -> dict[str, Any]:
    """The POST /jobs body for a cell; writes the pickled inputs under `.gpualloc/inputs/` first."""
    spec = job_spec(args)
    inputs, outputs = _names(args.inputs, "--inputs"), _names(args.outputs, "--outputs")
    if not cell.strip():
        raise InputError("the cell is empty: nothing to run")
    if args.retries < 0:
        raise InputError("--retries must be 0 or more")
    source: dict[str, Any] = {"kind": "cell", "code": cell, "inputs": inputs, "outputs": outputs}
    if inputs:
        data = pickle_inputs(inputs, namespace)
        relative = INPUTS_DIR / f"{secrets.token_hex(8)}.pkl"
        (workdir / INPUTS_DIR).mkdir(parents=True, exist_ok=True)
        (workdir / relative).write_bytes(data)
        source["inputs_file"] = str(relative)
    first_line = next((line.strip() for line in cell.splitlines() if line.strip()), "cell")
    request: dict[str, Any] = {
        "spec": spec, "source": source, "workdir": str(workdir), "name": args.name or first_line[:60],
        "priority": args.priority, "retries": args.retries,
        "kernel_name": os.environ.get("GPUALLOC_KERNEL_NAME", "python3"),
    }
    if args.preemptible is not None:
        request["preemptible"] = args.preemptible
    if args.timeout:
        request["timeout"] = parse_duration(args.timeout)
    return request


def job_table(jobs: list[dict[str, Any]]) -> list[str]:
    """Aligned rows: id, name, state, position, slice (what it asked for, until granted), runtime, reason."""
    header = ("ID", "NAME", "STATE", "POS", "SLICE", "RUNTIME", "REASON")
    rows = [header]
    for job in jobs:
        runtime = job.get("runtime_s")
        rows.append((job["id"], job["name"][:30], job["state"], "" if job.get("position") is None else
                     str(job["position"]), describe_lease(job),
                     format_duration(runtime) if runtime is not None else "", job.get("reason", "")[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]


class KernelJobs:
    """The job actions of one kernel, through the kernel's service client."""

    def __init__(self, kernel_gpu, shell):
        self.kernel_gpu = kernel_gpu
        self.shell = shell

    @property
    def client(self):
        return self.kernel_gpu.client

    def submit(self, line: str, cell: str) -> None:
        args = job_submit_parser().parse_args(shlex.split(line))
        request = job_request(args, cell, self.shell.user_ns, Path.cwd())
        job = self.client.submit_job(request)
        print(f"gpu: job {job['id']} {job_submitted_text(job)}: %gpu job logs {job['id']} --follow")
        if self.kernel_gpu.in_kernel:
            from .job_widget import JobView
            from IPython.display import display

            display(JobView(self.client, job))

    def jobs(self) -> list[str]:
        jobs = self.client.jobs()
        if not jobs:
            return ["gpu: you have no jobs"]
        return [f"gpu: your jobs ({SERVER_NOTE})", *job_table(jobs)]

    def logs(self, job_id: str, follow: bool) -> None:
        if not follow:
            sys.stdout.write(self.client.job_log(job_id))
            return
        try:
            for chunk in self.client.follow_job_log(job_id):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:
            print("\ngpu: stopped following (the job goes on)")
            return
        print(f"gpu: job {job_id} {job_state_text(self.client.job(job_id), time.time())}")

    def cancel(self, job_id: str) -> list[str]:
        job = self.client.cancel_job(job_id)
        return [f"gpu: job {job_id} cancelled (it was {'running' if job.get('started_at') else 'queued'})"]

    def rerun(self, job_id: str) -> list[str]:
        job = self.client.rerun_job(job_id)
        return [f"gpu: job {job['id']}, a rerun of {job_id}, {job_submitted_text(job)}"]

    def result(self, job_id: str) -> list[str]:
        """Load the declared outputs of a succeeded job into this kernel."""
        import cloudpickle

        job = self.client.job(job_id)
        if job["state"] != "succeeded":
            return [f"gpu: job {job_id} has no results: it is {job_state_text(job, time.time())}"]
        outputs = job["source"].get("outputs") or []
        if job["source"]["kind"] != "cell" or not outputs:
            return [f"gpu: job {job_id} declared no --outputs: see {JobFolder(job['workdir'], job_id).executed}"]
        path = JobFolder(job["workdir"], job_id).outputs
        try:
            values = cloudpickle.loads(read_regular(str(path)))
        except OSError as err:
            raise InputError(f"cannot read the outputs of job {job_id} ({path}): {err.strerror}") from None
        except Refused as err:
            raise InputError(f"cannot read the outputs of job {job_id}: {err}") from None
        self.shell.user_ns.update(values)
        return [f"gpu: job {job_id}: loaded {', '.join(values)}"]


def job_line(kernel_gpu, shell, line: str) -> None:
    """`%gpu jobs` and `%gpu job logs|cancel|result|rerun ID`: one line (or the log) out, errors in one line."""
    try:
        words = shlex.split(line)
    except ValueError as err:
        print(f"gpu: {err}", file=sys.stderr)
        return
    jobs = KernelJobs(kernel_gpu, shell)
    try:
        if words == ["jobs"]:
            _say(jobs.jobs())
            return
        args = job_action_parser().parse_args(words[1:])
        if args.follow and args.action != "logs":
            raise InputError("--follow goes with %gpu job logs")
        if args.action == "logs":
            jobs.logs(args.job_id, args.follow)
        else:
            _say(getattr(jobs, args.action)(args.job_id))
    except UsageError as err:
        print(f"gpu: {err} (e.g. %gpu jobs, %gpu job logs ID --follow, %gpu job result ID)", file=sys.stderr)
    except Exception as err:
        if not is_reported(err):
            raise
        print(error_line(err, kernel_gpu.service_url), file=sys.stderr)


@magics_class
class GpuJobMagics(Magics):
    """`%%gpu job ...`: this cell as a background job."""

    def __init__(self, shell, kernel_gpu):
        super().__init__(shell)
        self.jobs = KernelJobs(kernel_gpu, shell)

    @cell_magic
    def gpu(self, line: str, cell: str) -> None:
        words = line.split(None, 1)
        if not words or words[0] != "job":
            print("gpu: %%gpu runs a cell as a background job: %%gpu job --mem 40GB ... (%%gpu? shows the options)",
                  file=sys.stderr)
            return
        try:
            self.jobs.submit(words[1] if len(words) > 1 else "", cell)
        except UsageError as err:
            print(f"gpu: {err} (%%gpu? shows the options)", file=sys.stderr)
        except Exception as err:
            if not is_reported(err):
                raise
            print(error_line(err, self.jobs.kernel_gpu.service_url), file=sys.stderr)

    gpu.__doc__ = job_submit_parser().format_help()


def _say(lines: list[str]) -> None:
    for line in lines:
        print(line)
