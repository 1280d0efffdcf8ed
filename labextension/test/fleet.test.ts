import { describe, expect, it } from 'vitest';

import { gpuMemory, memorySlices, migBlocks, shareSegments } from '../src/model/fleet';
import { Gpu } from '../src/model/types';

/** An A100 (8 memory slices) as the inventory gives it: 1g.5gb at 4 (mine), 3g.20gb at 0 (someone else's). */
const A100: Gpu = {
  uuid: 'GPU-a',
  index: 0,
  model: 'A100-SXM4-40GB',
  memory_mib: 40960,
  mig_mode: 'dynamic',
  drained: false,
  instances: [
    { uuid: 'MIG-2', profile: '1g.5gb', start: 4, size: 1, lease_id: 'mine-1' },
    { uuid: 'MIG-1', profile: '3g.20gb', start: 0, size: 4, lease_id: 'other' }
  ],
  free_memory_slices: 3
};

/** An A30 (4 memory slices): 2g.12gb at 2, nothing else. */
const A30: Gpu = {
  uuid: 'GPU-b',
  model: 'A30',
  memory_mib: 24576,
  mig_mode: 'static',
  drained: true,
  instances: [{ profile: '2g.12gb', start: 2, size: 2, lease_id: null }],
  free_memory_slices: 2
};

describe('MIG drawing', () => {
  it('counts the memory slices of the model from the inventory', () => {
    expect(memorySlices(A100)).toBe(8);
    expect(memorySlices(A30)).toBe(4);
    expect(memorySlices({ ...A30, memory_slices: 4, instances: [], free_memory_slices: 0 })).toBe(4);
  });

  it('puts every instance at its real start and fills the rest with free slices', () => {
    const blocks = migBlocks(A100, new Set(['mine-1']));
    expect(blocks.map(b => [b.start, b.size, b.owner, b.profile])).toEqual([
      [0, 4, 'other', '3g.20gb'],
      [4, 1, 'mine', '1g.5gb'],
      [5, 1, 'free', null],
      [6, 1, 'free', null],
      [7, 1, 'free', null]
    ]);
  });

  it('covers every slice exactly once', () => {
    for (const gpu of [A100, A30]) {
      const covered = migBlocks(gpu, new Set()).flatMap(b =>
        Array.from({ length: b.size }, (_, i) => b.start + i)
      );
      expect(covered).toEqual(Array.from({ length: memorySlices(gpu) }, (_, i) => i));
    }
  });

  it('draws an A30 with 4 slices and an unassigned instance as free', () => {
    const blocks = migBlocks(A30, new Set());
    expect(blocks.map(b => [b.start, b.size, b.owner, b.profile])).toEqual([
      [0, 1, 'free', null],
      [1, 1, 'free', null],
      [2, 2, 'free', '2g.12gb']
    ]);
  });

  it('names the holder only where the inventory does (admins)', () => {
    const admin = { ...A100, instances: [{ profile: '7g.40gb', start: 0, size: 8, lease_id: 'x', user: 'bob' }] };
    const [block] = migBlocks(admin, new Set());
    expect(block.user).toBe('bob');
    expect(migBlocks(A100, new Set())[0].user).toBeNull();
  });

  it('reports memory held by slices', () => {
    expect(gpuMemory(A100)).toEqual({ usedMib: 25600, totalMib: 40960 });
  });
});

describe('shared GPU bar', () => {
  const L4: Gpu = {
    uuid: 'GPU-c',
    model: 'L4',
    memory_mib: 20000,
    mig_mode: 'off',
    drained: false,
    shares: [
      { lease_id: 'mine-2', memory_mib: 8000, kind: 'shared' },
      { lease_id: 'other', memory_mib: 2000, kind: 'shared' }
    ],
    free_memory_mib: 10000
  };

  it('shows each cap, then what is free, in proportion', () => {
    const segments = shareSegments(L4, new Set(['mine-2']));
    expect(segments.map(s => [s.owner, s.memoryMib, s.fraction])).toEqual([
      ['mine', 8000, 0.4],
      ['other', 2000, 0.1],
      ['free', 10000, 0.5]
    ]);
    expect(gpuMemory(L4)).toEqual({ usedMib: 10000, totalMib: 20000 });
  });

  it('draws a whole-GPU lease as the whole bar', () => {
    const whole = { ...L4, shares: [{ lease_id: 'other', memory_mib: 0, kind: 'whole' }], free_memory_mib: 0 };
    expect(shareSegments(whole, new Set()).map(s => [s.owner, s.fraction])).toEqual([['other', 1]]);
  });
});
