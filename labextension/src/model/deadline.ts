/** A time-boxed slice's time limit as the panel shows it: time left, warning, extensions left. */

import { formatCountdown, secondsLeft } from './countdown';
import { ApiError, plainError } from './errors';
import { Deadline } from './types';

export interface DeadlineView {
  secondsLeft: number;
  /** "time limit: 3:59:12 left". */
  text: string;
  /** Whether the allocator has warned that the limit is near (or it has passed). */
  warned: boolean;
  extensionsLeft: number;
  /** "1 extension left", "2 extensions left", "no extensions left". */
  extensionsText: string;
}

/** `warned`: a lease.deadline_warning event arrived since the slice was last fetched. */
export function deadlineView(deadline: Deadline, nowMs: number, warned = false): DeadlineView {
  const left = secondsLeft(deadline.at, nowMs);
  const n = deadline.extensions_left;
  return {
    secondsLeft: left,
    text: `time limit: ${formatCountdown(left)} left`,
    warned: warned || deadline.warned_at !== null || left === 0,
    extensionsLeft: n,
    extensionsText: n === 0 ? 'no extensions left' : `${n} extension${n === 1 ? '' : 's'} left`
  };
}

/** A refused extension in plain words: the allocator's reason for a 409, else as any refused call. */
export function extensionRefusal(err: unknown): string {
  if (err instanceof ApiError && err.status === 409) {
    return `Not extended: ${err.message.replace(/\.$/, '')}.`;
  }
  return plainError(err);
}
