/**
 * The event-stream reducer: what each event of `/gpualloc/api/events` changes in the panel's
 * state, and which notification it raises. Pure, so the panel and the tests share it.
 */

import { formatSpan, localTime } from './countdown';
import { holderName, sliceName } from './format';
import { jobOf } from './holders';
import { Deadline, GpuEvent, LeaseEntry } from './types';

/** An idle warning in force: the slice is released at `releaseAt` (epoch seconds) unless used. */
export interface IdleWarning {
  leaseId: string;
  holder: string;
  releaseAt: number | null;
}

/** A slice of mine that ended lately, and why, for the My slices section. */
export interface EndedSlice {
  leaseId: string;
  holder: string;
  /** "released at its time limit (reached its maximum duration of 4h)". */
  text: string;
  /** The slice it held ("1g.5gb"), null when it never had one. */
  slice: string | null;
  /** When it was granted and when it ended (epoch seconds); `grantedAt` null when not known. */
  grantedAt: number | null;
  endedAt: number;
}

/** The time an event arrives (epoch seconds) and how a time is written for people (local time). */
export interface Clock {
  now: number;
  timeOf: (epochS: number) => string;
}

const BROWSER_CLOCK = (): Clock => ({ now: Date.now() / 1000, timeOf: localTime });

export interface StreamState {
  slices: LeaseEntry[];
  warnings: Record<string, IdleWarning>;
  /** Deadline warnings in force (lease.deadline_warning, not yet extended): the release time (epoch s) or null. */
  deadlineWarnings: Record<string, number | null>;
  /** The last ENDED_LIMIT slices of mine that ended, latest first. */
  ended: EndedSlice[];
  /** Leases ever listed as mine (the most recent KNOWN_LIMIT): their ends are announced. */
  known: string[];
  /** Leases listed as queued and not granted since: their grants are announced. */
  waited: string[];
}

export type NoticeKind =
  | 'idle-warning'
  | 'released'
  | 'expired'
  | 'preempted'
  | 'granted-after-wait'
  | 'rejected'
  | 'kernel-shutdown'
  | 'over-cap'
  | 'deadline-warning'
  | 'deadline-extended'
  | 'deadline-released'
  | 'usage-released'
  | 'usage'
  | 'job-succeeded'
  | 'job-failed';

/** A notification to show: `type` is the JupyterLab notification type. */
export interface Notice {
  kind: NoticeKind;
  type: 'info' | 'success' | 'warning' | 'error';
  message: string;
  leaseId: string | null;
}

export interface Reduction {
  state: StreamState;
  notice: Notice | null;
  /** Whether the slices, offers and inventory should be fetched again. */
  refreshLeases: boolean;
  /** Whether the jobs should be fetched again. */
  refreshJobs: boolean;
}

export const INITIAL_STATE: StreamState = {
  slices: [],
  warnings: {},
  deadlineWarnings: {},
  ended: [],
  known: [],
  waited: []
};
export const KNOWN_LIMIT = 500;
export const ENDED_LIMIT = 5;

const ENDED = new Set(['released', 'expired', 'preempted', 'cancelled', 'rejected']);

function withoutWarning<T>(warnings: Record<string, T>, leaseId: string): Record<string, T> {
  const { [leaseId]: _dropped, ...rest } = warnings;
  return rest;
}

function union(ids: string[], more: string[]): string[] {
  return [...new Set([...ids, ...more])];
}

/** The state after a fresh list of my slices: warnings of leases no longer held are dropped. */
export function withSlices(state: StreamState, slices: LeaseEntry[]): StreamState {
  const held = new Set(slices.map(l => l.id));
  const queued = slices.filter(l => l.state === 'queued').map(l => l.id);
  return {
    ...state,
    slices,
    warnings: onlyHeld(state.warnings, held),
    deadlineWarnings: onlyHeld(state.deadlineWarnings, held),
    known: union(state.known, [...held]).slice(-KNOWN_LIMIT),
    waited: union(state.waited.filter(id => held.has(id)), queued)
  };
}

function onlyHeld<T>(warnings: Record<string, T>, held: ReadonlySet<string>): Record<string, T> {
  const kept: Record<string, T> = {};
  for (const [id, warning] of Object.entries(warnings)) {
    if (held.has(id)) {
      kept[id] = warning;
    }
  }
  return kept;
}

/** Why an expired lease ended, from its reason: its time limit, a used-up usage quota, or idleness. */
export function expiryCause(reason: string | undefined): 'deadline' | 'usage' | 'idle' {
  if (reason?.includes('maximum duration')) {
    return 'deadline';
  }
  return reason?.startsWith('usage quota') ? 'usage' : 'idle';
}

/** How an ended slice is listed: "released at its time limit (reached its maximum duration of 4h)". */
export function endedText(ended: string, reason: string | undefined): string {
  const why = reason ? ` (${reason})` : '';
  switch (ended) {
    case 'expired': {
      const cause = expiryCause(reason);
      const what =
        cause === 'deadline' ? 'at its time limit' : cause === 'usage' ? 'over a usage quota' : 'after being idle';
      return `released ${what}${why}`;
    }
    case 'preempted':
      return `taken back (preempted)${why}`;
    case 'rejected':
      return `refused${why}`;
    default:
      return 'released';
  }
}

/** Whose slice an event is about, as the notifications name it ("kernel <id>", which the panel turns into
 * its notebook's name; "this server"; "job <id>", into the job's name). */
function whoseSlice(event: GpuEvent): string {
  return event.kernel_id ? `kernel ${event.kernel_id}` : holderName(event.holder ?? '');
}

function message(event: GpuEvent, fallback: string): string {
  return event.message || fallback;
}

/** An ended slice as the My slices section lists it after its holder: "1g.5gb · 14:05–14:17 (12 min) · released". */
export function endedSummary(ended: EndedSlice, timeOf: (epochS: number) => string = localTime): string {
  const when =
    ended.grantedAt === null
      ? `ended ${timeOf(ended.endedAt)}`
      : `${timeOf(ended.grantedAt)}–${timeOf(ended.endedAt)} (${formatSpan(ended.endedAt - ended.grantedAt)})`;
  return [ended.slice, when, ended.text].filter(Boolean).join(' · ');
}

/** Apply one event (arriving at `clock.now`). Events of leases that are not mine (not in `slices`) change
 * nothing but a refresh. */
export function reduce(state: StreamState, event: GpuEvent, clock: Clock = BROWSER_CLOCK()): Reduction {
  const none = { state, notice: null, refreshLeases: false, refreshJobs: false };
  const type = event.type;
  if (type.startsWith('job.')) {
    const state_ = type.slice(4);
    if (state_ === 'succeeded' || state_ === 'failed' || state_ === 'timed_out') {
      const ok = state_ === 'succeeded';
      return {
        ...none,
        refreshJobs: true,
        notice: {
          kind: ok ? 'job-succeeded' : 'job-failed',
          type: ok ? 'success' : 'error',
          message: message(event, `GPU job ${event.job_id ?? ''} ${state_.replace('_', ' ')}.`),
          leaseId: null
        }
      };
    }
    return { ...none, refreshJobs: true };
  }
  if (type === 'kernel.gpu_shutdown') {
    return {
      ...none,
      refreshLeases: true,
      notice: {
        kind: 'kernel-shutdown',
        type: 'warning',
        message: message(event, `Kernel ${event.kernel_id} was shut down.`),
        leaseId: event.lease_id ?? null
      }
    };
  }
  if (type === 'watchdog.over_cap') {
    return {
      ...none,
      notice: {
        kind: 'over-cap',
        type: 'warning',
        message: message(event, 'A kernel uses more GPU memory than its slice allows.'),
        leaseId: event.lease_id ?? null
      }
    };
  }
  if (type === 'usage.warning' || type === 'usage.exceeded') {
    return {
      ...none,
      refreshLeases: true,
      notice: {
        kind: 'usage',
        type: type === 'usage.exceeded' ? 'error' : 'warning',
        message: message(event, 'Your GPU usage is near or over its quota.'),
        leaseId: event.lease_id ?? null
      }
    };
  }
  if (!type.startsWith('lease.') || !event.lease_id) {
    return none;
  }
  const leaseId = event.lease_id;
  const holder = event.holder ?? '';
  const known = state.known.includes(leaseId);
  const isJob = jobOf(holder) !== null;
  const refresh = { ...none, refreshLeases: true, refreshJobs: isJob };
  // an idle warning or its end changes nothing fetched that the panel shows of a listed slice
  const listed = state.slices.some(l => l.id === leaseId);
  const idle = { ...refresh, refreshLeases: !listed };
  switch (type.slice(6)) {
    case 'idle_warning':
      return {
        ...idle,
        state: {
          ...state,
          warnings: {
            ...state.warnings,
            [leaseId]: { leaseId, holder, releaseAt: event.release_at ?? null }
          }
        },
        notice: {
          kind: 'idle-warning',
          type: 'warning',
          message: event.release_at
            ? `The GPU slice of ${whoseSlice(event)} is idle: it goes at ${clock.timeOf(event.release_at)} ` +
              'unless it is used again.'
            : message(event, 'Your GPU slice is idle and will be released soon.'),
          leaseId
        }
      };
    case 'deadline_warning': {
      const timed = withDeadline(refresh, state, event);
      return {
        ...timed,
        state: { ...timed.state, deadlineWarnings: { ...state.deadlineWarnings, [leaseId]: event.release_at ?? null } },
        notice: known
          ? {
              kind: 'deadline-warning',
              type: 'warning',
              message: message(event, 'Your GPU slice reaches its time limit soon.'),
              leaseId
            }
          : null
      };
    }
    case 'extended': {
      const timed = withDeadline(refresh, state, event);
      return {
        ...timed,
        state: { ...timed.state, deadlineWarnings: withoutWarning(state.deadlineWarnings, leaseId) },
        notice: known
          ? {
              kind: 'deadline-extended',
              type: 'success',
              message: message(event, 'Your GPU slice was given more time.'),
              leaseId
            }
          : null
      };
    }
    case 'idle_cleared':
      return { ...idle, state: { ...state, warnings: withoutWarning(state.warnings, leaseId) } };
    case 'granted': {
      const waited = state.waited.includes(leaseId);
      const slices = state.slices.map(l =>
        l.id === leaseId
          ? {
              ...l,
              state: 'granted' as const,
              slice: event.slice ?? l.slice,
              position: null,
              granted_at: l.granted_at ?? clock.now
            }
          : l
      );
      return {
        ...refresh,
        state: { ...state, slices, waited: state.waited.filter(id => id !== leaseId) },
        notice: waited
          ? {
              kind: 'granted-after-wait',
              type: 'success',
              message: message(event, 'Your queued GPU request was granted.'),
              leaseId
            }
          : null
      };
    }
    default: {
      const ended = event.state ?? type.slice(6);
      if (!ENDED.has(ended)) {
        return refresh;
      }
      const listed = known && !isJob && ended !== 'cancelled';
      const before = state.slices.find(l => l.id === leaseId);
      const slice = event.slice ?? before?.slice ?? null;
      const entry: EndedSlice = {
        leaseId,
        holder,
        text: endedText(ended, event.reason),
        slice: slice ? sliceName(slice) : null,
        grantedAt: before?.granted_at ?? null,
        endedAt: clock.now
      };
      const next: StreamState = {
        ...state,
        slices: state.slices.filter(l => l.id !== leaseId),
        warnings: withoutWarning(state.warnings, leaseId),
        deadlineWarnings: withoutWarning(state.deadlineWarnings, leaseId),
        ended: listed
          ? [
              entry,
              ...state.ended.filter(e => e.leaseId !== leaseId)
            ].slice(0, ENDED_LIMIT)
          : state.ended,
        waited: state.waited.filter(id => id !== leaseId)
      };
      return { ...refresh, state: next, notice: known && !isJob ? endNotice(ended, event, leaseId) : null };
    }
  }
}

/**
 * A deadline event that carries the lease's time limit and extensions left: the listed slice takes
 * them, and nothing needs fetching again (the fleet did not change). Otherwise `refresh` as it is.
 */
function withDeadline(refresh: Reduction, state: StreamState, event: GpuEvent): Reduction {
  const listed = state.slices.find(l => l.id === event.lease_id);
  if (!listed || typeof event.deadline !== 'number' || typeof event.extensions_left !== 'number') {
    return { ...refresh, state };
  }
  const before = listed.deadline;
  const deadline: Deadline = {
    at: event.deadline,
    extensions: event.extensions ?? before?.extensions ?? 0,
    extensions_left: event.extensions_left,
    warned_at: event.type === 'lease.extended' ? null : (before?.warned_at ?? null)
  };
  const slices = state.slices.map(l => (l.id === listed.id ? { ...l, deadline } : l));
  return { ...refresh, state: { ...state, slices }, refreshLeases: false };
}

function endNotice(ended: string, event: GpuEvent, leaseId: string): Notice | null {
  switch (ended) {
    case 'released':
      return { kind: 'released', type: 'info', message: message(event, 'Your GPU slice was released.'), leaseId };
    case 'expired': {
      const cause = expiryCause(event.reason);
      if (cause === 'deadline') {
        return {
          kind: 'deadline-released',
          type: 'warning',
          message: message(event, 'Your GPU slice was released at its time limit.'),
          leaseId
        };
      }
      if (cause === 'usage') {
        return {
          kind: 'usage-released',
          type: 'error',
          message: message(event, 'Your GPU slice was released: a usage quota is used up.'),
          leaseId
        };
      }
      return {
        kind: 'expired',
        type: 'warning',
        message: message(event, 'Your GPU slice was released after being idle.'),
        leaseId
      };
    }
    case 'preempted':
      return {
        kind: 'preempted',
        type: 'error',
        message: message(event, 'Your GPU slice was taken back (preempted).'),
        leaseId
      };
    case 'rejected':
      return { kind: 'rejected', type: 'error', message: message(event, 'Your GPU request was refused.'), leaseId };
    default:
      return null;
  }
}
