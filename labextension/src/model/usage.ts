/** The Usage section's numbers: each usage quota of mine as a bar, its state and its sentence. */

import { UsageQuota } from './types';

export type QuotaState = 'ok' | 'warning' | 'exceeded';

export interface QuotaView {
  key: string;
  /** "My quota" or "Group students". */
  title: string;
  /** How full the bar is, 0 to 100. */
  percent: number;
  state: QuotaState;
  /** "12.5 of 40 GPU-hours". */
  amount: string;
  /** The allocator's sentence, with what was used, the limit, the window and when it resets. */
  sentence: string;
}

/** 12.5 -> "12.5", 0.25 -> "0.25", 40 -> "40", 0.004 -> "< 0.01": two decimals below 10 hours, one above. */
export function formatHours(hours: number): string {
  if (hours > 0 && hours < 0.005) {
    return '< 0.01';
  }
  const text = hours < 10 ? hours.toFixed(2) : hours.toFixed(1);
  return text.replace(/\.?0+$/, '') || '0';
}

/**
 * A quota's state: exceeded when used up (a zero limit is used up at once), warning from `warnFraction`
 * of the limit (the policy's usage_warn_fraction, from which the allocator warns the quota's leases).
 */
export function quotaState(used: number, limit: number, warnFraction: number): QuotaState {
  if (used >= limit) {
    return 'exceeded';
  }
  return used >= warnFraction * limit ? 'warning' : 'ok';
}

export function quotaView(quota: UsageQuota): QuotaView {
  const percent = quota.limit > 0 ? Math.min(100, (100 * quota.gpu_hours) / quota.limit) : 100;
  const sentence = quota.message.charAt(0).toUpperCase() + quota.message.slice(1);
  return {
    key: `${quota.scope}:${quota.who}:${quota.window}`,
    title: quota.scope === 'user' ? 'My quota' : `Group ${quota.who}`,
    percent,
    state: quotaState(quota.gpu_hours, quota.limit, quota.warn_fraction),
    amount: `${formatHours(quota.gpu_hours)} of ${formatHours(quota.limit)} GPU-hours`,
    sentence: sentence.endsWith('.') ? sentence : `${sentence}.`
  };
}
