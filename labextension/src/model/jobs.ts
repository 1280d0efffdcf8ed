/** Jobs as the Jobs section lists them (payloads of REST API v1 `/jobs`). */

import { Question, requestName, sliceName } from './format';
import { Job } from './types';

export const ACTIVE_JOB_STATES = new Set(['queued', 'running']);
export const FINISHED_JOB_STATES = new Set(['succeeded', 'failed', 'cancelled', 'timed_out']);

/**
 * Where "Open executed notebook" puts a visible copy of a notebook job's executed notebook (which
 * lands in the hidden `<workdir>/.gpualloc/jobs/<id>/`): `<stem>.job-<id>.ipynb` next to the
 * notebook, as a path under the server's root (absolute, `serverRoot`); null for cell jobs and
 * for jobs whose workdir is outside the root.
 */
export function executedCopy(job: Job, serverRoot: string): string | null {
  const root = serverRoot.replace(/\/+$/, '');
  const workdir = job.workdir ?? '';
  if (job.source?.kind !== 'notebook' || !job.source.path) {
    return null;
  }
  if (workdir !== root && !workdir.startsWith(`${root}/`)) {
    return null;
  }
  const dir = workdir.slice(root.length + 1);
  const stem = job.source.path.replace(/\.ipynb$/, '');
  return `${dir ? `${dir}/` : ''}${stem}.job-${job.id}.ipynb`;
}

/** The REST API v1 job for a notebook (path under the server's root) run on a slice of `spec`. */
export function notebookJob(path: string, serverRoot: string, spec: Record<string, unknown>) {
  const slash = path.lastIndexOf('/');
  const dir = slash >= 0 ? path.slice(0, slash) : '';
  const root = serverRoot.replace(/\/+$/, '');
  return {
    name: path,
    spec,
    source: { kind: 'notebook', path: path.slice(slash + 1) },
    workdir: dir ? `${root}/${dir}` : root
  };
}

/** Newest first. */
export function sortedJobs(jobs: Job[]): Job[] {
  return [...jobs].sort((a, b) => (b.created_at ?? 0) - (a.created_at ?? 0));
}

/**
 * The newest rerun of a job, following reruns of reruns (`rerun_of`): what a cell that shows the job
 * shows after its Rerun; null when it was never rerun.
 */
export function latestRerun(jobs: Job[], id: string): Job | null {
  let latest: Job | null = null;
  const seen = new Set([id]);
  for (let current = id; ; ) {
    const next = sortedJobs(jobs).find(job => job.rerun_of === current && !seen.has(job.id));
    if (!next) {
      return latest;
    }
    latest = next;
    seen.add(next.id);
    current = next.id;
  }
}

/** What a job's cell says of its newest rerun: "Rerun: resubmitted as job j2 (queued, position 1)". */
export function rerunText(rerun: Job): string {
  const place = rerun.state === 'queued' && typeof rerun.position === 'number' ? `, position ${rerun.position}` : '';
  return `Rerun: resubmitted as job ${rerun.id} (${rerun.state}${place})`;
}

/** What a job runs on: "on 1g.5gb" once its slice is granted, else what it asks for ("asks for 8 GiB shared"). */
export function jobSliceText(job: Job): string | null {
  if (job.slice) {
    return `on ${sliceName(job.slice)}`;
  }
  return job.spec && ACTIVE_JOB_STATES.has(job.state) ? `asks for ${requestName(job.spec)}` : null;
}

/** The question asked before cancelling a running job (its work so far is lost); null for a queued one. */
export function cancelQuestion(job: Job): Question | null {
  if (job.state !== 'running') {
    return null;
  }
  const name = job.name || job.id;
  return {
    title: `Cancel the GPU job ${name}?`,
    body: `${name} is running: cancelling stops it now, and what it has not saved is lost. Its GPU slice is released.`,
    accept: 'Cancel the job'
  };
}
