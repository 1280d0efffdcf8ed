import { describe, expect, it } from 'vitest';

import { ApiError, plainError } from '../src/model/errors';

describe('refusals in plain words', () => {
  it('says which rule refused a request', () => {
    expect(plainError(new ApiError(403, 'user quota of 1 slice reached'))).toBe(
      'Your quota does not allow this: user quota of 1 slice reached'
    );
    expect(plainError(new ApiError(409, 'no GPU fits'))).toBe('Not possible right now: no GPU fits');
    expect(plainError(new ApiError(503, 'drained'))).toMatch(/drained for maintenance/);
    expect(plainError(new ApiError(500, 'boom'))).toBe('boom');
    expect(plainError(new TypeError('Failed to fetch'))).toBe('The request failed: Failed to fetch');
  });
});
