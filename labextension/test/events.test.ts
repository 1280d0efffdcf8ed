import { describe, expect, it } from 'vitest';

import { endedSummary, INITIAL_STATE, reduce, StreamState, withSlices } from '../src/model/events';
import { namedAfterNotebook } from '../src/model/format';
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

  it('an idle warning says first when the slice goes (a long notification is cut short)', () => {
    const event = { type: 'lease.idle_warning', lease_id: 'a', holder: 'kernel:k-a', kernel_id: 'k-a', message: 'idle' };
    const r = reduce(held, { ...event, release_at: 1000 }, { now: 700, timeOf: t => `at-${t}` });
    expect(r.notice?.message).toBe('The GPU slice of kernel k-a is idle: it goes at at-1000 unless it is used again.');
    expect(namedAfterNotebook(r.notice!.message, 'k-a', 'a.ipynb')).toMatch(/^The GPU slice of a.ipynb is idle: /);
    expect(reduce(held, event).notice?.message).toBe('idle');
  });

  it('records an idle warning with its release time and asks to notify with Extend', () => {
    const r = reduce(held, { type: 'lease.idle_warning', lease_id: 'a', holder: 'kernel:k-a', release_at: 1000 });
    expect(r.state.warnings.a).toEqual({ leaseId: 'a', holder: 'kernel:k-a', releaseAt: 1000 });
    expect(r.notice).toMatchObject({ kind: 'idle-warning', type: 'warning', leaseId: 'a' });
    expect(r.refreshLeases).toBe(false); // the event says all the panel shows of it
    expect(reduce(held, { type: 'lease.idle_warning', lease_id: 'new', release_at: 1000 }).refreshLeases).toBe(true);
  });

  it('drops the warning when the slice is used again', () => {
    const warned = reduce(held, { type: 'lease.idle_warning', lease_id: 'a', release_at: 1000 }).state;
    const r = reduce(warned, { type: 'lease.idle_cleared', lease_id: 'a' });
    expect(r.state.warnings).toEqual({});
    expect(r.notice).toBeNull();
    expect(r.refreshLeases).toBe(false);
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

  it('keeps a deadline warning until the slice is extended, and announces the extension', () => {
    const warned = reduce(held, { type: 'lease.deadline_warning', lease_id: 'a', release_at: 900 }).state;
    expect(warned.deadlineWarnings).toEqual({ a: 900 });
    expect(withSlices(warned, [lease('a', 'granted')]).deadlineWarnings).toEqual({ a: 900 });
    const extended = reduce(warned, { type: 'lease.extended', lease_id: 'a', state: 'granted', message: 'until 5' });
    expect(extended.state.deadlineWarnings).toEqual({});
    expect(extended.notice).toMatchObject({ kind: 'deadline-extended', type: 'success', message: 'until 5' });
    expect(extended.refreshLeases).toBe(true);
    expect(reduce(held, { type: 'lease.extended', lease_id: 'zzz', state: 'granted' }).notice).toBeNull();
    expect(withSlices(warned, [lease('b', 'queued')]).deadlineWarnings).toEqual({});
  });

  it('tells a release at the time limit and over a usage quota from an idle one, and lists them', () => {
    const warned = reduce(held, { type: 'lease.deadline_warning', lease_id: 'a', release_at: 900 }).state;
    const atLimit = reduce(warned, {
      type: 'lease.expired',
      lease_id: 'a',
      holder: 'kernel:k-a',
      state: 'expired',
      reason: 'reached its maximum duration of 1h'
    });
    expect(atLimit.notice).toMatchObject({ kind: 'deadline-released', type: 'warning' });
    expect(atLimit.state.deadlineWarnings).toEqual({});
    expect(atLimit.state.ended).toMatchObject([
      { leaseId: 'a', holder: 'kernel:k-a', text: 'released at its time limit (reached its maximum duration of 1h)' }
    ]);
    const reasons: [string, string][] = [
      ['usage quota used up: you have used 40.00 of 40 GPU-hours', 'usage-released'],
      ['idle for 306 s', 'expired']
    ];
    for (const [reason, kind] of reasons) {
      expect(reduce(held, { type: 'lease.expired', lease_id: 'a', state: 'expired', reason }).notice?.kind).toBe(kind);
    }
  });

  it('lists the last five ended slices of mine, latest first, not cancelled requests or jobs', () => {
    const ids = ['z', 'y', 'a', 'b', 'c', 'd'];
    let state = withSlices(INITIAL_STATE, ids.map(id => lease(id, 'granted')));
    state = withSlices(state, [...state.slices, lease('q', 'queued'), lease('j', 'granted', 'job:j1')]);
    for (const id of [...ids, 'q', 'j']) {
      const type = id === 'q' ? 'lease.cancelled' : id === 'd' ? 'lease.preempted' : 'lease.released';
      const holder = id === 'j' ? 'job:j1' : `kernel:k-${id}`;
      state = reduce(state, { type, lease_id: id, holder, state: type.slice(6) }).state;
    }
    expect(state.ended.map(e => [e.leaseId, e.text])).toEqual([
      ['d', 'taken back (preempted)'],
      ['c', 'released'],
      ['b', 'released'],
      ['a', 'released'],
      ['y', 'released']
    ]);
  });

  it('keeps of each ended slice the slice, when it was granted and when it ended, listed once', () => {
    const clock = { now: 2000, timeOf: (t: number) => `t${t}` };
    const granted = { ...lease('a', 'granted'), slice: SLICE, granted_at: 1280 };
    let state = withSlices(INITIAL_STATE, [granted]);
    state = reduce(state, { type: 'lease.released', lease_id: 'a', holder: 'kernel:k-a', state: 'released' }, clock)
      .state;
    // the same end told again (a resynced stream) lists it once still
    state = reduce(
      withSlices(state, [granted]),
      { type: 'lease.released', lease_id: 'a', holder: 'kernel:k-a', state: 'released' },
      clock
    ).state;
    expect(state.ended).toEqual([
      { leaseId: 'a', holder: 'kernel:k-a', text: 'released', slice: '1g.5gb', grantedAt: 1280, endedAt: 2000 }
    ]);
    expect(endedSummary(state.ended[0], clock.timeOf)).toBe('1g.5gb · t1280–t2000 (12 min) · released');
    // a request refused before it got a slice: when it ended, and why
    const refused = reduce(
      withSlices(INITIAL_STATE, [lease('b', 'queued')]),
      { type: 'lease.rejected', lease_id: 'b', holder: 'kernel:k-b', state: 'rejected', reason: 'no GPU fits' },
      clock
    ).state.ended[0];
    expect(endedSummary(refused, clock.timeOf)).toBe('ended t2000 · refused (no GPU fits)');
  });

  it('a slice granted from the queue ends with the time it was granted', () => {
    const clock = { now: 500, timeOf: String };
    let state = withSlices(INITIAL_STATE, [lease('b', 'queued')]);
    state = reduce(state, { type: 'lease.granted', lease_id: 'b', holder: 'kernel:k-b', slice: SLICE }, clock).state;
    state = reduce(state, { type: 'lease.expired', lease_id: 'b', holder: 'kernel:k-b', state: 'expired',
      reason: 'idle for 306 s' }, { now: 900, timeOf: String }).state;
    expect(state.ended[0]).toMatchObject({ slice: '1g.5gb', grantedAt: 500, endedAt: 900 });
  });

  it('ignores what is not an event of the allocator', () => {
    const r = reduce(held, { type: 'something.else' });
    expect(r.state).toBe(held);
    expect([r.notice, r.refreshLeases, r.refreshJobs]).toEqual([null, false, false]);
  });
});

describe('deadline events carry the time limit', () => {
  const timed: LeaseEntry = {
    ...lease('a', 'granted'),
    deadline: { at: 1000, extensions: 0, extensions_left: 1, warned_at: null }
  };
  const held = withSlices(INITIAL_STATE, [timed]);

  it('a deadline warning updates the listed slice and needs no fetch', () => {
    const r = reduce(held, {
      type: 'lease.deadline_warning',
      lease_id: 'a',
      state: 'granted',
      release_at: 1000,
      deadline: 1000,
      extensions_left: 0
    });
    expect(r.state.slices[0].deadline).toEqual({ at: 1000, extensions: 0, extensions_left: 0, warned_at: null });
    expect(r.state.deadlineWarnings).toEqual({ a: 1000 });
    expect(r.refreshLeases).toBe(false);
  });

  it('an extension moves the listed deadline and clears its warning, with no fetch', () => {
    const warned = reduce(held, { type: 'lease.deadline_warning', lease_id: 'a', release_at: 1000 }).state;
    const r = reduce(warned, {
      type: 'lease.extended',
      lease_id: 'a',
      state: 'granted',
      deadline: 1600,
      extensions: 1,
      extensions_left: 0
    });
    expect(r.state.slices[0].deadline).toEqual({ at: 1600, extensions: 1, extensions_left: 0, warned_at: null });
    expect(r.state.deadlineWarnings).toEqual({});
    expect(r.notice?.kind).toBe('deadline-extended');
    expect(r.refreshLeases).toBe(false);
  });

  it('a slice not listed yet, or an event without the time limit, is fetched', () => {
    expect(reduce(held, { type: 'lease.extended', lease_id: 'zzz', deadline: 5, extensions_left: 0 }).refreshLeases).toBe(
      true
    );
    expect(reduce(held, { type: 'lease.extended', lease_id: 'a' }).refreshLeases).toBe(true);
  });
});
