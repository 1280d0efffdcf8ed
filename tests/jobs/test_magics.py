"""`%%gpu job` and `%gpu jobs` / `%gpu job ...` in a real kernel of a real jupyter server, run by its runner."""

from __future__ import annotations

import re

from tests.jobs.conftest import job_ends


async def test_a_cell_job_and_its_result(notebook_kernel, jobs_client):
    await notebook_kernel("data = list(range(10))")
    out, err = await notebook_kernel("%%gpu job --shared 4GB --name squares --inputs data --outputs total\n"
                                     "total = sum(x * x for x in data)\nprint('total', total)")
    assert err == "", err
    # its slice is free, so it is granted at once: position 0 in the service's answer
    match = re.match(r"gpu: job (\w+) has its slice and is starting: %gpu job logs \1 --follow\n", out)
    assert match, out
    job_id = match.group(1)
    done = await job_ends(jobs_client, job_id)
    assert done["state"] == "succeeded", done
    out, _ = await notebook_kernel("import os\nprint(os.environ['GPUALLOC_KERNEL_NAME'])")
    assert done["kernel_name"] == out.strip() != ""  # the job ran in a kernel of the notebook's kernelspec
    out, err = await notebook_kernel(f"%gpu job result {job_id}\nprint(total)")
    assert out.splitlines() == [f"gpu: job {job_id}: loaded total", "285"], (out, err)
    out, _ = await notebook_kernel("%gpu jobs")
    assert "jobs run inside your Jupyter server" in out and job_id in out and "succeeded" in out
    out, _ = await notebook_kernel(f"%gpu job logs {job_id}")
    assert "total 285" in out
    out, _ = await notebook_kernel(f"%gpu job logs {job_id} --follow")
    assert "total 285" in out and f"gpu: job {job_id} succeeded" in out


async def test_inputs_are_checked_before_anything_is_queued(notebook_kernel, jobs_client):
    out, err = await notebook_kernel("%%gpu job --shared 4GB --inputs missing\nprint(missing)")
    assert err.strip() == "gpu: input 'missing' is not defined in this kernel: nothing was queued"
    await notebook_kernel("import threading\nlock = threading.Lock()")
    out, err = await notebook_kernel("%%gpu job --shared 4GB --inputs lock\nprint(lock)")
    assert err.startswith("gpu: input 'lock' cannot be pickled (TypeError") and err.count("\n") == 1, err
    out, err = await notebook_kernel("%%gpu job --shared 4GB --mig 1g.5gb\nx = 1")
    assert err.startswith("gpu: give one of") and err.count("\n") == 1, err
    out, err = await notebook_kernel("%%gpu job --shared 4GB --retries lots\nx = 1")
    assert err.startswith("gpu: argument --retries") and err.count("\n") == 1, err
    assert await jobs_client.jobs() == []


async def test_cancel_rerun_and_no_result_from_the_kernel(notebook_kernel, jobs_client):
    out, _ = await notebook_kernel("%%gpu job --whole --model L4 --timeout 1m\nimport time\ntime.sleep(60)")
    job_id = re.search(r"gpu: job (\w+) (has its slice|queued)", out).group(1)
    out, err = await notebook_kernel(f"%gpu job result {job_id}")
    assert out.startswith(f"gpu: job {job_id} has no results: it is "), (out, err)
    out, _ = await notebook_kernel(f"%gpu job cancel {job_id}")
    assert out.startswith(f"gpu: job {job_id} cancelled"), out
    out, err = await notebook_kernel(f"%gpu job cancel {job_id}")
    assert err == f"gpu: job {job_id} has already ended (cancelled)\n", err
    out, _ = await notebook_kernel(f"%gpu job rerun {job_id}")
    rerun = re.fullmatch(rf"gpu: job (\w+), a rerun of {job_id}, (has its slice and is starting|queued at "
                         r"position \d+)\n", out).group(1)
    await jobs_client.cancel_job(rerun)
    out, err = await notebook_kernel("%gpu job logs nosuchjob")
    assert err == "gpu: no job nosuchjob\n", err
