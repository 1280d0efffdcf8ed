import { describe, expect, it } from 'vitest';

import { executedCopy, notebookJob, sortedJobs } from '../src/model/jobs';
import { Job } from '../src/model/types';

describe('notebook jobs', () => {
  it('runs a notebook in its own folder under the server root', () => {
    expect(notebookJob('exp/run/train.ipynb', '/home/me/', { kind: 'mig', profile: '1g.5gb' })).toEqual({
      name: 'exp/run/train.ipynb',
      spec: { kind: 'mig', profile: '1g.5gb' },
      source: { kind: 'notebook', path: 'train.ipynb' },
      workdir: '/home/me/exp/run'
    });
    expect(notebookJob('train.ipynb', '/home/me', {}).workdir).toBe('/home/me');
  });

  it('copies the executed notebook next to the notebook, never for cells or outside the root', () => {
    const job: Job = {
      id: 'j1',
      state: 'succeeded',
      workdir: '/home/me/exp',
      source: { kind: 'notebook', path: 'train.ipynb' }
    };
    expect(executedCopy(job, '/home/me')).toBe('exp/train.job-j1.ipynb');
    expect(executedCopy({ ...job, workdir: '/home/me' }, '/home/me/')).toBe('train.job-j1.ipynb');
    expect(executedCopy({ ...job, workdir: '/home/meow' }, '/home/me')).toBeNull();
    expect(executedCopy({ ...job, source: { kind: 'cell', code: 'x = 1' } }, '/home/me')).toBeNull();
  });

  it('lists the newest first', () => {
    const jobs: Job[] = [
      { id: 'a', state: 'succeeded', created_at: 1 },
      { id: 'b', state: 'running', created_at: 3 },
      { id: 'c', state: 'queued', created_at: 2 }
    ];
    expect(sortedJobs(jobs).map(j => j.id)).toEqual(['b', 'c', 'a']);
  });
});
