/** Jobs as the Jobs section lists them (payloads of REST API v1 `/jobs`). */

import { Job } from './types';

export const ACTIVE_JOB_STATES = new Set(['queued', 'running']);
export const FINISHED_JOB_STATES = new Set(['succeeded', 'failed', 'cancelled', 'timed_out']);

/** Where a notebook job's executed copy lands: `.gpualloc/jobs/<id>/executed.ipynb` next to the notebook. */
export function executedNotebook(job: Job): string | null {
  if (job.source?.kind !== 'notebook' || !job.source.path) {
    return null;
  }
  const path = job.source.path;
  const slash = path.lastIndexOf('/');
  const dir = slash >= 0 ? path.slice(0, slash + 1) : '';
  return `${dir}.gpualloc/jobs/${job.id}/executed.ipynb`;
}

/** Newest first. */
export function sortedJobs(jobs: Job[]): Job[] {
  return [...jobs].sort((a, b) => (b.created_at ?? 0) - (a.created_at ?? 0));
}
