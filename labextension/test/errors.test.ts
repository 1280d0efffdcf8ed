import { describe, expect, it } from 'vitest';

import { ApiError, plainError, unreachableText } from '../src/model/errors';

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

describe('why the panel has no fleet', () => {
  it("says GPU slices are off, with the server's instruction, when the server has no allocator", () => {
    const off = new ApiError(503, 'set c.GpuAllocExtension.fleet in ~/.jupyter/jupyter_server_config.py');
    expect(unreachableText(off)).toBe(
      'GPU slices are off on this server: set c.GpuAllocExtension.fleet in ~/.jupyter/jupyter_server_config.py'
    );
  });

  it("does not say it twice when the server's message says GPU slices are off", () => {
    const off = new ApiError(503, 'GPU slices and jobs are off: no GPU was found (NVML not found) and no fleet file');
    expect(unreachableText(off)).toBe(
      'GPU slices and jobs are off: no GPU was found (NVML not found) and no fleet file'
    );
  });

  it('says the allocator cannot be reached otherwise', () => {
    expect(unreachableText(new ApiError(502, 'Bad Gateway'))).toBe('The GPU allocator cannot be reached: Bad Gateway');
    expect(unreachableText(new TypeError('Failed to fetch'))).toBe(
      'The GPU allocator cannot be reached: Failed to fetch'
    );
  });
});
