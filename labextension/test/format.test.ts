import { describe, expect, it } from 'vitest';

import { gib, protection, requestName, sliceName } from '../src/model/format';
import { LeaseEntry, SliceInfo } from '../src/model/types';
import { kernelLease } from './leases';

function slice(kind: SliceInfo['kind'], memoryMib: number, extra: Partial<SliceInfo> = {}): SliceInfo {
  return { kind, node: 'n0', gpu_uuids: ['GPU-0'], memory_mib: memoryMib, ...extra } as SliceInfo;
}

function granted(caps: string[], kind: SliceInfo['kind'] = 'shared'): LeaseEntry {
  return { ...kernelLease('k1', 'granted'), slice: slice(kind, 8192), caps };
}

describe('sizes as the kernel writes them', () => {
  it('writes GiB with at most two decimals and no trailing zero', () => {
    expect(gib(8192)).toBe('8');
    expect(gib(9728)).toBe('9.5');
    expect(gib(4864)).toBe('4.75');
    expect(gib(3174)).toBe('3.1');
    expect(sliceName(slice('shared', 8192))).toBe('8 GiB shared');
  });
});

describe('what a queued request asks for', () => {
  it('names the request, never just its kind', () => {
    expect(requestName({ kind: 'mig', profile: '1g.10gb' })).toBe('1g.10gb');
    expect(requestName({ kind: 'whole', model: 'H100 80GB HBM3' })).toBe('whole H100 80GB HBM3');
    expect(requestName({ kind: 'whole', count: 2 })).toBe('2 whole GPUs');
    expect(requestName({ kind: 'whole', count: 2, model: 'L4' })).toBe('2 whole L4');
    expect(requestName({ kind: 'whole', count: 1 })).toBe('whole GPU');
    expect(requestName({ kind: 'shared', memory_gib: 8, model: 'L4' })).toBe('8 GiB shared on L4');
    expect(requestName({ kind: 'any', memory_gib: 10 })).toBe('10 GiB');
    expect(requestName({ kind: 'any' })).toBe('GPU slice');
  });
});

describe("how a slice is held to its share, each mechanism once", () => {
  it('names the caps in force, else the isolation', () => {
    expect(protection(granted(['framework']))).toBe('framework cap');
    expect(protection(granted(['framework', 'watchdog']))).toBe('framework cap + watchdog');
    expect(protection(granted(['mig'], 'mig'))).toBe('MIG hardware');
    expect(protection(granted([], 'whole'))).toBe('whole GPU');
  });
});
