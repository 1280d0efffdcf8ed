/** The idle countdown: seconds left before an idle-warned slice is released, and before idle release
 * comes at all. */

import { IdleRelease } from './types';

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

/** A span for people, rounded up: 45 -> "45 s", 300 -> "5 min", 5400 -> "1 h 30 min". */
export function formatSpan(seconds: number): string {
  const s = Math.max(0, Math.ceil(seconds));
  if (s < 120) {
    return `${s} s`;
  }
  const minutes = Math.ceil(s / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const rest = minutes % 60;
  return `${Math.floor(minutes / 60)} h${rest ? ` ${rest} min` : ''}`;
}

/** An epoch-seconds time as the browser's local clock writes it ("14:05:09"). */
export function localTime(epochS: number): string {
  return new Date(epochS * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

/**
 * How long until idle release takes a granted slice back, before any warning: "idle release in 12 min
 * (warned at 14:05:09, then a 5 min grace)"; "not counted as idle: a cell runs" while its holder is busy;
 * null without idle release, once warned (the warning's own countdown says it), or where the service
 * gives no account of it. `timeOf` writes a time (local by default).
 */
export function idleReleaseText(
  lease: { state: string; idle_timeout?: number | null; idle_release?: IdleRelease | null },
  nowMs: number,
  timeOf: (epochS: number) => string = localTime
): string | null {
  if (lease.state !== 'granted' || !lease.idle_timeout || lease.idle_release === undefined) {
    return null;
  }
  const release = lease.idle_release;
  if (release === null) {
    return 'not counted as idle: a cell runs';
  }
  if (release.warned) {
    return null;
  }
  const left = formatSpan(release.release_at - nowMs / 1000);
  return `idle release in ${left} (warned at ${timeOf(release.warn_at)}, then a ${formatSpan(release.grace)} grace)`;
}
