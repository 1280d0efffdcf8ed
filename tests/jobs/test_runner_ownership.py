"""Each of a user's servers runs only the jobs submitted through it; ended jobs' pickled inputs are deleted."""

from __future__ import annotations

import asyncio

import cloudpickle

from jupyter_gpualloc.client import GpuAllocClient
from jupyter_gpualloc.jobs.runner import JobRunner
from tests.jobs.conftest import cell_job, job_ends, wait_for


def other_server_client(gpualloc) -> GpuAllocClient:
    """A client as a kernel or terminal of the user's named server 'gpu2' has it."""
    return GpuAllocClient(gpualloc.client.url, gpualloc.server_token(), env={"JUPYTERHUB_SERVER_NAME": "gpu2"})


async def test_a_job_submitted_through_another_server_is_left_to_that_server(jobs_client, workdir, gpualloc):
    other = other_server_client(gpualloc)
    try:
        theirs = await other.submit_job(cell_job(workdir, "x = 1"))
        assert (theirs["runner"], theirs["position"]) == ("server:gpu2", 0)
        mine = await jobs_client.submit_job(cell_job(workdir, "y = 2"))
        assert mine["runner"] == "server"
        assert (await job_ends(jobs_client, mine["id"]))["state"] == "succeeded"
        await asyncio.sleep(1.0)  # five more rounds of this server's runner
        assert (await jobs_client.job(theirs["id"]))["state"] == "queued"
        running = await other.start_job(theirs["id"])  # gpu2's runner claims it
        assert running["state"] == "running"
        # a restarted runner of this server recovers only its own jobs: gpu2's running job is left alone
        restarted = JobRunner(jobs_client, service_url=jobs_client.url)
        await restarted.poll()
        again = await jobs_client.job(theirs["id"])
        assert (again["state"], again["attempts"]) == ("running", 1), again
        await other.finish_job(theirs["id"], 1, "succeeded")
    finally:
        await other.close()


async def test_only_the_jobs_server_may_claim_it(jobs_client, workdir, gpualloc):
    from jupyter_gpualloc.client import Conflict

    other = other_server_client(gpualloc)
    try:
        theirs = await other.submit_job(cell_job(workdir, "x = 1"))
        try:
            await jobs_client.start_job(theirs["id"])
            raise AssertionError("this server claimed gpu2's job")
        except Conflict as err:
            assert "runs in server:gpu2, not in server" in str(err) and err.state == "queued"
        await other.cancel_job(theirs["id"])
    finally:
        await other.close()


async def test_the_inputs_of_a_job_are_deleted_once_it_ended_for_good_not_when_it_is_retried(jobs_client, workdir):
    inputs = workdir / ".gpualloc" / "inputs"
    inputs.mkdir(parents=True)
    (inputs / "a.pkl").write_bytes(cloudpickle.dumps({"data": [1, 2, 3]}))
    # the first attempt fails after loading its inputs; the retry needs them again
    code = ("import os\nfirst = not os.path.exists('tried')\nopen('tried', 'w').close()\n"
            "assert not first, 'first attempt'\ntotal = sum(data)")
    job = await jobs_client.submit_job(cell_job(workdir, code, retries=1, source={
        "inputs": ["data"], "outputs": ["total"], "inputs_file": ".gpualloc/inputs/a.pkl"}))
    done = await job_ends(jobs_client, job["id"])
    assert (done["state"], done["attempts"]) == ("succeeded", 2), done
    outputs = workdir / ".gpualloc" / "jobs" / job["id"] / "outputs.pkl"
    await wait_for(lambda: not (inputs / "a.pkl").exists(), 10)
    assert cloudpickle.loads(outputs.read_bytes()) == {"total": 6}

    (inputs / "b.pkl").write_bytes(cloudpickle.dumps({"data": [4]}))
    queued = await jobs_client.submit_job(cell_job(workdir, "x = data", source={
        "inputs": ["data"], "inputs_file": ".gpualloc/inputs/b.pkl"}))
    await jobs_client.cancel_job(queued["id"])
    await wait_for(lambda: not (inputs / "b.pkl").exists(), 10)
