import { describe, expect, it } from 'vitest';

import { deadlineView, extensionRefusal } from '../src/model/deadline';
import { ApiError } from '../src/model/errors';

const DEADLINE = { at: 10_000, extensions: 0, extensions_left: 1, warned_at: null };

describe('time limit of a slice', () => {
  it('counts down to the deadline and says how many extensions are left', () => {
    const view = deadlineView(DEADLINE, 10_000 * 1000 - 3725_000);
    expect(view).toMatchObject({
      secondsLeft: 3725,
      text: 'time limit: 1:02:05 left',
      warned: false,
      extensionsLeft: 1,
      extensionsText: '1 extension left'
    });
    expect(deadlineView({ ...DEADLINE, extensions_left: 2 }, 0).extensionsText).toBe('2 extensions left');
    expect(deadlineView({ ...DEADLINE, extensions_left: 0 }, 0).extensionsText).toBe('no extensions left');
  });

  it('is warned once the allocator warned (stored or by event) or the limit has passed', () => {
    expect(deadlineView({ ...DEADLINE, warned_at: 9_100 }, 9_200_000).warned).toBe(true);
    expect(deadlineView(DEADLINE, 9_200_000, true).warned).toBe(true);
    const past = deadlineView(DEADLINE, 10_500_000);
    expect([past.secondsLeft, past.warned]).toEqual([0, true]);
  });

  it('words a refused extension with the allocator reason', () => {
    const refused = new ApiError(409, 'this lease has used its 1 extension(s); it ends at its deadline');
    expect(extensionRefusal(refused)).toBe(
      'Not extended: this lease has used its 1 extension(s); it ends at its deadline.'
    );
    expect(extensionRefusal(new ApiError(404, 'no lease x'))).toBe('Not found: no lease x');
  });
});
