/** A job's cell after its Rerun: it says the job was resubmitted and follows the new job (issue 40, item 7). */
import { describe, expect, it } from 'vitest';

import { latestRerun, rerunText } from '../src/model/jobs';
import { Job } from '../src/model/types';

const FIRST: Job = { id: 'j1', name: 'train', state: 'succeeded', created_at: 10 };
const SECOND: Job = { id: 'j2', name: 'train', state: 'queued', position: 1, created_at: 30, rerun_of: 'j1' };
const THIRD: Job = { id: 'j3', name: 'train', state: 'running', created_at: 40, rerun_of: 'j2' };
const OTHER: Job = { id: 'x', name: 'other', state: 'running', created_at: 50 };

describe("the rerun a job's cell shows", () => {
  it('follows reruns of reruns to the newest, and is null for a job never rerun', () => {
    expect(latestRerun([FIRST, OTHER], 'j1')).toBeNull();
    expect(latestRerun([FIRST, SECOND, OTHER], 'j1')).toBe(SECOND);
    expect(latestRerun([THIRD, FIRST, SECOND], 'j1')).toBe(THIRD);
    expect(latestRerun([FIRST, SECOND, THIRD], 'j3')).toBeNull();
  });

  it('takes the newest of two reruns of one job, and stops on a cycle', () => {
    const again: Job = { ...SECOND, id: 'j2b', created_at: 35 };
    expect(latestRerun([FIRST, SECOND, again], 'j1')).toBe(again);
    expect(latestRerun([{ ...FIRST, rerun_of: 'j2' }, SECOND], 'j1')).toBe(SECOND);
  });

  it("says it was resubmitted, with the new job's state and place in the queue", () => {
    expect(rerunText(SECOND)).toBe('Rerun: resubmitted as job j2 (queued, position 1)');
    expect(rerunText(THIRD)).toBe('Rerun: resubmitted as job j3 (running)');
  });
});
