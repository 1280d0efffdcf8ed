import { describe, expect, it } from 'vitest';

import { INITIAL_STATE, reduce, StreamState, withSlices } from '../src/model/events';
import { LeaseEntry } from '../src/model/types';

function lease(id: string, state: 'queued' | 'granted', holder = `kernel:k-${id}`): LeaseEntry {
  return {
    id,
    user: 'me',
    holder,
    spec: { kind: 'mig', profile: '1g.5gb' },
    priority: 'interactive',
    state,
    slice: null,
    created_at: 0,
    reason: '',
    position: state === 'queued' ? 2 : null
  };
}

const SLICE = {
  kind: 'mig' as const,
  node: 'ws',
  gpu_uuids: ['GPU-a'],
  memory_mib: 4864,
  profile: '1g.5gb',
  visible_devices: 'MIG-1'
};

describe('event-stream reducer', () => {
  const held: StreamState = withSlices(INITIAL_STATE, [lease('a', 'granted'), lease('b', 'queued')]);

  it('records an idle warning with its release time and asks to notify with Extend', () => {
    const r = reduce(held, { type: 'lease.idle_warning', lease_id: 'a', holder: 'kernel:k-a', release_at: 1000 });
    expect(r.state.warnings.a).toEqual({ leaseId: 'a', holder: 'kernel:k-a', releaseAt: 1000 });
    expect(r.notice).toMatchObject({ kind: 'idle-warning', type: 'warning', leaseId: 'a' });
    expect(r.refreshLeases).toBe(true);
  });

  it('drops the warning when the slice is used again', () => {
    const warned = reduce(held, { type: 'lease.idle_warning', lease_id: 'a', release_at: 1000 }).state;
    const r = reduce(warned, { type: 'lease.idle_cleared', lease_id: 'a' });
    expect(r.state.warnings).toEqual({});
    expect(r.notice).toBeNull();
  });

  it('announces a grant only after a wait', () => {
    const waited = reduce(held, { type: 'lease.granted', lease_id: 'b', state: 'granted', slice: SLICE });
    expect(waited.notice?.kind).toBe('granted-after-wait');
    const b = waited.state.slices.find(l => l.id === 'b');
    expect(b?.state).toBe('granted');
    expect(b?.slice).toEqual(SLICE);
    expect(b?.position).toBeNull();
    const immediate = reduce(held, { type: 'lease.granted', lease_id: 'new', state: 'granted' });
    expect(immediate.notice).toBeNull();
    expect(immediate.refreshLeases).toBe(true);
  });

  it('removes ended slices and their warnings, and says why', () => {
    const warned = reduce(held, { type: 'lease.idle_warning', lease_id: 'a', release_at: 5 }).state;
    for (const [type, kind] of [
      ['lease.expired', 'expired'],
      ['lease.preempted', 'preempted'],
      ['lease.released', 'released']
    ]) {
      const r = reduce(warned, { type, lease_id: 'a', state: type.slice(6), message: `it was ${kind}` });
      expect(r.state.slices.map(l => l.id)).toEqual(['b']);
      expect(r.state.warnings).toEqual({});
      expect(r.notice).toMatchObject({ kind, message: `it was ${kind}` });
    }
  });

  it('announces a grant after a wait and an end even when a refresh got there first', () => {
    const refreshed = withSlices(held, [lease('a', 'granted'), { ...lease('b', 'queued'), state: 'granted' }]);
    const granted = reduce(refreshed, { type: 'lease.granted', lease_id: 'b', state: 'granted' });
    expect(granted.notice?.kind).toBe('granted-after-wait');
    expect(reduce(granted.state, { type: 'lease.granted', lease_id: 'b' }).notice).toBeNull();
    const gone = withSlices(held, [lease('b', 'queued')]);
    expect(reduce(gone, { type: 'lease.released', lease_id: 'a', state: 'released' }).notice?.kind).toBe(
      'released'
    );
  });

  it('stays quiet about a cancelled request and about leases that are not mine', () => {
    expect(reduce(held, { type: 'lease.cancelled', lease_id: 'b', state: 'cancelled' }).notice).toBeNull();
    const foreign = reduce(held, { type: 'lease.preempted', lease_id: 'zzz', state: 'preempted' });
    expect(foreign.notice).toBeNull();
    expect(foreign.state.slices).toHaveLength(2);
  });

  it('turns job events into a jobs refresh and a notification when they finish', () => {
    const started = reduce(held, { type: 'job.started', job_id: 'j1' });
    expect([started.refreshJobs, started.notice]).toEqual([true, null]);
    expect(reduce(held, { type: 'job.succeeded', job_id: 'j1' }).notice?.type).toBe('success');
    expect(reduce(held, { type: 'job.failed', job_id: 'j1' }).notice?.kind).toBe('job-failed');
    const jobLease = reduce(withSlices(INITIAL_STATE, [lease('j', 'granted', 'job:j1')]), {
      type: 'lease.released',
      lease_id: 'j',
      holder: 'job:j1',
      state: 'released'
    });
    expect([jobLease.notice, jobLease.refreshJobs]).toEqual([null, true]);
  });

  it('keeps warnings only of slices still held after a refresh', () => {
    const warned = reduce(held, { type: 'lease.idle_warning', lease_id: 'a', release_at: 5 }).state;
    expect(withSlices(warned, [lease('a', 'granted')]).warnings.a).toBeDefined();
    expect(withSlices(warned, [lease('b', 'queued')]).warnings).toEqual({});
  });

  it('warns of a time limit ahead and of usage quotas', () => {
    const deadline = reduce(held, { type: 'lease.deadline_warning', lease_id: 'a', state: 'granted', message: 'ends at 5' });
    expect(deadline.notice).toMatchObject({ kind: 'deadline-warning', type: 'warning', message: 'ends at 5' });
    expect(deadline.state.slices).toHaveLength(2);
    expect(reduce(held, { type: 'usage.warning' }).notice?.type).toBe('warning');
    expect(reduce(held, { type: 'usage.exceeded' }).notice?.type).toBe('error');
  });

  it('ignores what is not an event of the allocator', () => {
    const r = reduce(held, { type: 'something.else' });
    expect(r.state).toBe(held);
    expect([r.notice, r.refreshLeases, r.refreshJobs]).toEqual([null, false, false]);
  });
});
