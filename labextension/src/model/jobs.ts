/** Jobs as the Jobs section lists them (payloads of REST API v1 `/jobs`). */

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
