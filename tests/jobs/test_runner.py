"""Jobs run by the server extension's runner: real kernels under nbclient, a real jupyter server."""

from __future__ import annotations

import json
import sys

import cloudpickle
import nbformat

from tests.jobs.conftest import cell_job, job_ends, wait_for


async def test_a_cell_job_runs_in_its_slice_and_saves_its_outputs(jobs_client, workdir, gpualloc):
    code = "import os\nprint('training on', os.environ['CUDA_VISIBLE_DEVICES'])\nwhere = os.getcwd()\nx = 6 * 7"
    job = await jobs_client.submit_job(cell_job(workdir, code, source={"outputs": ["x", "where"]}, name="answer"))
    slice_ = job["slice"]
    done = await job_ends(jobs_client, job["id"])
    assert (done["state"], done["attempts"], done["reason"]) == ("succeeded", 1, "all cells ran"), done
    folder = workdir / ".gpualloc" / "jobs" / job["id"]
    assert cloudpickle.loads((folder / "outputs.pkl").read_bytes()) == {"x": 42, "where": str(workdir)}
    log = (folder / "job.log").read_text()
    assert f"training on {slice_['visible_devices']}" in log and "succeeded" in log
    assert nbformat.read(folder / "executed.ipynb", as_version=4).cells[0].outputs[0]["name"] == "stdout"
    assert gpualloc.embedded.scheduler.leases() == []  # the lease ended with the job
    # while it was queued and running, the server counted as active (JupyterHub's culler reads this)
    assert gpualloc.serverapp.web_app.settings["last_activity_times"]["gpualloc_jobs"].timestamp() >= job["created_at"]
    assert "training on" in await jobs_client.job_log(job["id"])


async def test_a_job_that_raises_fails_with_its_traceback_in_the_log(jobs_client, workdir):
    job = await jobs_client.submit_job(cell_job(workdir, "def f():\n    return 1 / 0\nf()"))
    done = await job_ends(jobs_client, job["id"])
    assert done["state"] == "failed" and done["reason"] == "ZeroDivisionError: division by zero", done
    log = (workdir / ".gpualloc" / "jobs" / job["id"] / "job.log").read_text()
    assert "Traceback" in log or "ZeroDivisionError" in log
    assert "return 1 / 0" in log


async def test_timeout_and_retries(jobs_client, workdir):
    job = await jobs_client.submit_job(cell_job(workdir, "import time\ntime.sleep(60)", timeout=1.5, retries=1))
    done = await job_ends(jobs_client, job["id"])
    assert (done["state"], done["attempts"]) == ("timed_out", 2), done["reason"]
    log = (workdir / ".gpualloc" / "jobs" / job["id"] / "job.log").read_text()
    assert log.count("timed out: still running after 1.5 s") == 2


async def test_cancel_while_queued_and_while_running(jobs_client, workdir, gpualloc):
    whole = {"kind": "whole", "model": "L4"}
    running = await jobs_client.submit_job(cell_job(workdir, "import time\nprint('started', flush=True)\ntime.sleep(60)",
                                                    spec=whole))
    queued = await jobs_client.submit_job(cell_job(workdir, "x = 1", spec=whole))
    assert queued["position"] == 1
    assert (await jobs_client.cancel_job(queued["id"]))["state"] == "cancelled"
    log = workdir / ".gpualloc" / "jobs" / running["id"] / "job.log"
    await wait_for(lambda: log.exists() and "started" in log.read_text(), 60)
    assert (await jobs_client.cancel_job(running["id"]))["state"] == "cancelled"
    await wait_for(lambda: not gpualloc.runner.attempts, 15)
    assert "stopped: cancelled" in log.read_text()
    assert gpualloc.embedded.scheduler.leases() == []


async def test_two_jobs_beyond_capacity_run_one_after_the_other(jobs_client, workdir):
    whole = {"kind": "whole", "model": "L4"}  # the fleet has one L4
    first = await jobs_client.submit_job(cell_job(workdir, "import time\ntime.sleep(1)", spec=whole))
    second = await jobs_client.submit_job(cell_job(workdir, "x = 2", spec=whole))
    assert (first["position"], second["position"]) == (0, 1)
    done_first = await job_ends(jobs_client, first["id"])
    done_second = await job_ends(jobs_client, second["id"])
    assert (done_first["state"], done_second["state"]) == ("succeeded", "succeeded")
    assert done_first["ended_at"] <= done_second["started_at"]


# A kernel that takes its time to start (a big environment's imports): it says when it is starting.
SLOW_START = """
import pathlib, runpy, sys, time
pathlib.Path(sys.argv[2]).write_text("starting")
time.sleep(60)
sys.argv = ["ipykernel_launcher", "-f", sys.argv[1]]
runpy.run_module("ipykernel_launcher", run_name="__main__")
"""


async def test_cancelling_a_job_whose_kernel_still_starts_gives_the_start_up_quietly(jobs_client, workdir, gpualloc,
                                                                                    jp_data_dir, capfd):
    """Cancel while the job's kernel starts: nothing to interrupt yet, so no SIGINT (whose KeyboardInterrupt
    traceback the server's log showed), the start is given up, the kernel ended and the slice returned."""
    starting = workdir / "kernel-starting"
    spec_dir = jp_data_dir / "kernels" / "slow-start"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-c", SLOW_START, "{connection_file}", str(starting)],
        "display_name": "Python (slow start)", "language": "python"}))
    job = await jobs_client.submit_job(cell_job(workdir, "x = 1", kernel_name="slow-start"))
    await wait_for(starting.exists, 30)
    capfd.readouterr()
    assert (await jobs_client.cancel_job(job["id"]))["state"] == "cancelled"
    await wait_for(lambda: not gpualloc.runner.attempts, 15)
    out, err = capfd.readouterr()
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err
    assert "stopped: cancelled" in (workdir / ".gpualloc" / "jobs" / job["id"] / "job.log").read_text()
    assert gpualloc.embedded.scheduler.leases() == []
