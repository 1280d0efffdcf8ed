/** The idle countdown: seconds left before an idle-warned slice is released. */

/** Whole seconds from `nowMs` until `releaseAt` (epoch seconds), never below zero. */
export function secondsLeft(releaseAt: number, nowMs: number): number {
  return Math.max(0, Math.ceil(releaseAt - nowMs / 1000));
}

/** 75 -> "1:15", 3725 -> "1:02:05". */
export function formatCountdown(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  const hours = Math.floor(s / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  const rest = String(s % 60).padStart(2, '0');
  return hours > 0
    ? `${hours}:${String(minutes).padStart(2, '0')}:${rest}`
    : `${minutes}:${rest}`;
}

/** A job's or lease's running time from two epoch-second stamps ("—" before it started). */
export function formatDuration(
  start: number | null | undefined,
  end: number | null | undefined,
  nowMs: number
): string {
  if (start === null || start === undefined) {
    return '—';
  }
  const until = end ?? nowMs / 1000;
  return formatCountdown(until - start);
}
