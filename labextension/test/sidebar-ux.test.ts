/** What the panel and the status bar say of reasons, idle release, a server that is off or stopped, and jobs
 * (issue 40). */
import { describe, expect, it } from 'vitest';

import { formatSpan, idleReleaseText } from '../src/model/countdown';
import { notTheServer, ServerStopped, unreachableText } from '../src/model/errors';
import { namedAfterJob, statusBarText } from '../src/model/format';
import { cancelQuestion, jobSliceText } from '../src/model/jobs';
import { offerAvailability } from '../src/model/request';
import { recheckDelay } from '../src/model/stream';
import { Job, LeaseEntry, Offer } from '../src/model/types';
import { kernelLease } from './leases';

const OFFER: Offer = { name: 'shared-8gb', label: 'Shared 8 GiB', spec: { kind: 'shared', memory_gib: 8 }, available: 13 };
const FULL = 'user quota for alice: at most 2 slices (2 slices in use)';

describe('offers in the request list', () => {
  it('says the quota is full now instead of a free count, and why in full', () => {
    expect(offerAvailability({ ...OFFER, quota_full: FULL })).toEqual({
      state: 'quota-full',
      text: `your quota is full now: ${FULL}`,
      why: FULL
    });
    expect(offerAvailability(OFFER)).toEqual({ state: 'free', text: '13 free now', why: null });
    expect(offerAvailability({ ...OFFER, available: 0 }).text).toBe('none free: you would wait');
  });

  it('keeps the greyed-out wording of offers a quota refuses', () => {
    const usage = { ...OFFER, over_usage_quota: 'you have used 40 of 40 GPU-hours', quota_full: FULL };
    expect(offerAvailability(usage)).toMatchObject({ state: 'refused', text: 'usage quota used up' });
    expect(offerAvailability({ ...OFFER, over_quota: 'at most 8 GiB', quota_full: null })).toEqual({
      state: 'refused',
      text: 'over your quota',
      why: 'at most 8 GiB'
    });
  });
});

describe('idle release before the warning', () => {
  const granted: LeaseEntry = { ...kernelLease('k', 'granted'), idle_timeout: 600 };
  const release = { since: 1000, warn_at: 1600, release_at: 1900, grace: 300, warned: false };
  const timeOf = (t: number) => `T${t}`;

  it('counts down to the release, with when the warning comes and the grace after it', () => {
    const lease = { ...granted, idle_release: release };
    expect(idleReleaseText(lease, 1180_000, timeOf)).toBe('idle release in 12 min (warned at T1600, then a 5 min grace)');
    expect(idleReleaseText(lease, 1840_000, timeOf)).toBe('idle release in 60 s (warned at T1600, then a 5 min grace)');
  });

  it('says a busy kernel is not counted as idle, and nothing without idle release or once warned', () => {
    expect(idleReleaseText({ ...granted, idle_release: null }, 0)).toBe('not counted as idle: a cell runs');
    expect(idleReleaseText({ ...granted, idle_timeout: null, idle_release: null }, 0)).toBeNull();
    expect(idleReleaseText({ ...granted, idle_release: { ...release, warned: true } }, 0)).toBeNull();
    expect(idleReleaseText({ ...granted, state: 'queued', idle_release: null }, 0)).toBeNull();
    expect(idleReleaseText(granted, 0)).toBeNull(); // a service that gives no account of it
  });

  it('writes spans rounded up', () => {
    expect([45, 119.2, 300, 301, 5400, 3600].map(formatSpan)).toEqual(['45 s', '2 min', '5 min', '6 min', '1 h 30 min', '1 h']);
  });
});

describe('the status bar before the first answer, with GPU off, after the server stopped', () => {
  const held: LeaseEntry = {
    ...kernelLease('k', 'granted'),
    slice: { kind: 'mig', node: 'ws', gpu_uuids: ['GPU-a'], memory_mib: 4864, profile: '1g.5gb', visible_devices: 'MIG-1' }
  };

  it('never says "no GPU" before it knows, nor keeps a stopped server\'s GPU', () => {
    expect(statusBarText('loading', [])).toBe('…');
    expect(statusBarText('on', [])).toBe('no GPU');
    expect(statusBarText('on', [held])).toBe('GPU 1g.5gb · 4.75 GiB');
    expect(statusBarText('stopped', [held])).toBe('server stopped');
    expect(statusBarText('off', [])).toBe('GPU off');
  });

  it('takes a failed connection or an answer not from the server API as a stopped server', () => {
    expect(notTheServer(404, false)).toBe(true);
    expect(notTheServer(503, false)).toBe(true);
    expect(notTheServer(424, true)).toBe(true);
    expect(notTheServer(404, true)).toBe(false); // the API's own "no job x"
    expect(notTheServer(503, true)).toBe(false); // the API's own "GPU slices are off"
    expect(unreachableText(new ServerStopped('no answer (Failed to fetch)'))).toBe(
      'The server stopped: no answer (Failed to fetch)'
    );
  });

  it('asks a stopped server again less and less often', () => {
    expect([0, 1, 2, 3, 5, 20].map(recheckDelay)).toEqual([10_000, 20_000, 40_000, 80_000, 300_000, 300_000]);
  });
});

describe('jobs', () => {
  const running: Job = { id: '01b9a677245b', name: 'train-resnet', state: 'running', spec: { kind: 'shared', memory_gib: 8 } };

  it('shows the slice granted once there is one, else what is asked for', () => {
    expect(jobSliceText({ ...running, state: 'queued', slice: null })).toBe('asks for 8 GiB shared');
    const slice = { kind: 'shared' as const, node: 'ws', gpu_uuids: ['GPU-b'], memory_mib: 8192, visible_devices: '0' };
    expect(jobSliceText({ ...running, slice })).toBe('on 8 GiB shared');
    expect(jobSliceText({ ...running, state: 'succeeded', slice: null })).toBeNull();
  });

  it('asks before cancelling a running job, not a queued one', () => {
    expect(cancelQuestion(running)).toMatchObject({ title: 'Cancel the GPU job train-resnet?', accept: 'Cancel the job' });
    expect(cancelQuestion({ ...running, state: 'queued' })).toBeNull();
  });

  it("names a job's lease in notices by the job's name", () => {
    const message = 'The GPU slice of job 01b9a677245b reaches its time limit; GPU usage of job:01b9a677245b.';
    expect(namedAfterJob(message, 'job:01b9a677245b', 'train-resnet')).toBe(
      'The GPU slice of job train-resnet reaches its time limit; GPU usage of job train-resnet.'
    );
    expect(namedAfterJob(message, 'kernel:abc', 'x')).toBe(message);
    expect(namedAfterJob(message, 'job:01b9a677245b', undefined)).toBe(message);
  });
});
