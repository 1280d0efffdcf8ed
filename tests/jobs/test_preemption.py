"""One queue for jobs and interactive requests: order, preemption with the partial log kept, requeue, success."""

from __future__ import annotations

from tests.jobs.conftest import PREEMPT_GRACE, cell_job, job_ends, sleeps_on_first_attempt, wait_for

WHOLE_L4 = {"kind": "whole", "model": "L4"}
FIRST_ATTEMPT_SLEEPS = sleeps_on_first_attempt("attempts-a", "a is working, attempt", 60)


async def test_an_interactive_request_preempts_a_running_job_which_later_succeeds(jobs_client, workdir, gpualloc,
                                                                                   notebook_kernel):
    a = await jobs_client.submit_job(cell_job(workdir, FIRST_ATTEMPT_SLEEPS, spec=WHOLE_L4, name="a"))
    b = await jobs_client.submit_job(cell_job(workdir, "print('b ran')", spec=WHOLE_L4, name="b"))
    assert (a["position"], b["position"]) == (0, 1)  # one L4: b waits behind a
    log_a = workdir / ".gpualloc" / "jobs" / a["id"] / "job.log"
    await wait_for(lambda: log_a.exists() and "a is working, attempt 1" in log_a.read_text(), 60)

    # an interactive %gpu request goes before the queued job b, and takes a's GPU from it (once
    # a's attempt has stopped, under policy wait_for_holders)
    out, err = await notebook_kernel(f"%gpu request --whole --model L4 --wait {10 + 3 * PREEMPT_GRACE:g}s")
    assert "gpu: granted whole GPU on L4" in out, (out, err)
    preempted = await jobs_client.job(a["id"])
    assert (preempted["state"], preempted["preemptions"]) == ("queued", 1), preempted
    await wait_for(lambda: "stopped: preempted" in log_a.read_text(), 10 + 3 * PREEMPT_GRACE)
    queued = [(await jobs_client.job(j["id"]))["position"] for j in (b, a)]
    assert queued == [1, 2], queued  # b keeps its place ahead of the requeued a

    out, _ = await notebook_kernel("%gpu release")
    assert out.startswith("gpu: released"), out
    done_b = await job_ends(jobs_client, b["id"])
    done_a = await job_ends(jobs_client, a["id"])
    assert (done_b["state"], done_a["state"], done_a["attempts"]) == ("succeeded", "succeeded", 2)
    assert done_b["ended_at"] <= done_a["started_at"]  # in order, one GPU
    text = log_a.read_text()
    assert text.index("working, attempt 1") < text.index("stopped: preempted") < text.index("working, attempt 2")
    assert gpualloc.embedded.scheduler.leases() == []
