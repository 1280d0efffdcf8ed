import { describe, expect, it } from 'vitest';

import { formatHours, quotaState, quotaView } from '../src/model/usage';
import { UsageQuota } from '../src/model/types';

const WEEK: UsageQuota = {
  scope: 'user',
  who: 'ada',
  gpu_hours: 12.5,
  limit: 40,
  window: 'calendar_week',
  resets_at: 1_796_601_600,
  warn_fraction: 0.9,
  message: 'you have used 12.50 of 40 GPU-hours this week (resets Mon 2026-12-07 00:00 UTC)'
};

describe('usage quotas', () => {
  it('writes GPU-hours without trailing zeros, two decimals under ten hours', () => {
    expect(formatHours(12.5)).toBe('12.5');
    expect(formatHours(40)).toBe('40');
    expect(formatHours(0)).toBe('0');
    expect(formatHours(0.254)).toBe('0.25');
    expect(formatHours(100.04)).toBe('100');
    expect(formatHours(0.004)).toBe('< 0.01');
    expect(formatHours(0.005)).toBe('0.01');
  });

  it('warns from the given fraction of the limit and is used up at the limit', () => {
    expect(quotaState(35.9, 40, 0.9)).toBe('ok');
    expect(quotaState(36, 40, 0.9)).toBe('warning');
    expect(quotaState(40, 40, 0.9)).toBe('exceeded');
    expect(quotaState(41, 40, 0.9)).toBe('exceeded');
    expect(quotaState(0, 0, 0.9)).toBe('exceeded');
    expect(quotaState(5, 10, 0.5)).toBe('warning');
  });

  it("marks a quota almost used up from the policy's warning fraction, as the allocator sent it", () => {
    expect(quotaView({ ...WEEK, gpu_hours: 30 }).state).toBe('ok');
    expect(quotaView({ ...WEEK, gpu_hours: 30, warn_fraction: 0.75 }).state).toBe('warning');
    expect(quotaView({ ...WEEK, gpu_hours: 30, warn_fraction: 0.8 }).state).toBe('ok');
  });

  it('shows a quota as a bar, the amount and the allocator sentence with its reset', () => {
    const view = quotaView(WEEK);
    expect(view).toMatchObject({ title: 'My quota', percent: 31.25, state: 'ok', amount: '12.5 of 40 GPU-hours' });
    expect(view.sentence).toBe(
      'You have used 12.50 of 40 GPU-hours this week (resets Mon 2026-12-07 00:00 UTC).'
    );
  });

  it('names a group quota and keeps the bar full once over the limit', () => {
    const view = quotaView({ ...WEEK, scope: 'group', who: 'students', gpu_hours: 210, limit: 200 });
    expect([view.title, view.percent, view.state]).toEqual(['Group students', 100, 'exceeded']);
    expect(quotaView({ ...WEEK, limit: 0, gpu_hours: 0 }).percent).toBe(100);
    expect(quotaView(WEEK).key).not.toBe(view.key);
  });
});
