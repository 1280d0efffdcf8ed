"""A store outage while a job runs: the runner's report is refused (503) and made again once the store is back."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from tests.jobs.conftest import cell_job, job_ends, wait_for


async def test_a_refused_report_is_made_again_and_the_slice_is_given_back(jobs_client, workdir, gpualloc):
    job = await jobs_client.submit_job(cell_job(workdir, "import time\nprint('started', flush=True)\ntime.sleep(1)"))
    log = workdir / ".gpualloc" / "jobs" / job["id"] / "job.log"
    await wait_for(lambda: log.exists() and "started" in log.read_text(), 60)
    database = create_engine(gpualloc.db_url)
    try:
        with database.begin() as conn:
            conn.execute(text("ALTER TABLE jobs RENAME TO jobs_away"))
        await wait_for(lambda: job["id"] in gpualloc.runner._unreported, 30)
    finally:
        with database.begin() as conn:
            conn.execute(text("ALTER TABLE jobs_away RENAME TO jobs"))
        database.dispose()
    done = await job_ends(jobs_client, job["id"])
    assert (done["state"], done["attempts"]) == ("succeeded", 1), done
    assert gpualloc.embedded.scheduler.leases() == [] and not gpualloc.runner._unreported
