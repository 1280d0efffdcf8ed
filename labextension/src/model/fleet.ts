/**
 * The fleet drawing, computed from the inventory payload: a MIG GPU as its row of memory
 * slices with each instance at its real start, a shared GPU as a bar of memory caps.
 */

import { Gpu, MigInstance, Share } from './types';

/** Whose a part of a GPU is, from the caller's point of view. */
export type Owner = 'mine' | 'other' | 'free';

/** A run of memory slices on a MIG GPU: one instance, or one unused slice. */
export interface MigBlock {
  start: number;
  size: number;
  owner: Owner;
  profile: string | null;
  leaseId: string | null;
  user: string | null;
}

/** A part of a non-MIG GPU's memory: a share (cap), a whole-GPU lease, or what is free. */
export interface ShareSegment {
  memoryMib: number;
  fraction: number;
  owner: Owner;
  kind: string;
  leaseId: string | null;
  user: string | null;
}

function ownerOf(leaseId: string | null | undefined, mine: ReadonlySet<string>): Owner {
  if (leaseId === null || leaseId === undefined) {
    return 'free';
  }
  return mine.has(leaseId) ? 'mine' : 'other';
}

/** How many memory slices a MIG GPU has (A30: 4, A100/H100: 8), from the inventory. */
export function memorySlices(gpu: Gpu): number {
  if (gpu.memory_slices) {
    return gpu.memory_slices;
  }
  const used = (gpu.instances ?? []).reduce((sum, i) => sum + i.size, 0);
  return (gpu.free_memory_slices ?? 0) + used;
}

/**
 * A MIG GPU's memory slices from first to last: each instance as one block at its start,
 * every slice no instance covers as a free block of size 1.
 */
export function migBlocks(gpu: Gpu, mine: ReadonlySet<string>): MigBlock[] {
  const total = memorySlices(gpu);
  const instances = [...(gpu.instances ?? [])].sort((a, b) => a.start - b.start);
  const blocks: MigBlock[] = [];
  let next = 0;
  const free = (start: number): MigBlock => ({
    start,
    size: 1,
    owner: 'free',
    profile: null,
    leaseId: null,
    user: null
  });
  for (const instance of instances) {
    for (; next < instance.start; next++) {
      blocks.push(free(next));
    }
    blocks.push(instanceBlock(instance, mine));
    next = Math.max(next, instance.start + instance.size);
  }
  for (; next < total; next++) {
    blocks.push(free(next));
  }
  return blocks;
}

function instanceBlock(instance: MigInstance, mine: ReadonlySet<string>): MigBlock {
  return {
    start: instance.start,
    size: instance.size,
    owner: ownerOf(instance.lease_id, mine),
    profile: instance.profile,
    leaseId: instance.lease_id ?? null,
    user: instance.user ?? null
  };
}

/** A non-MIG GPU's memory as its shares (each its cap) followed by what is free. */
export function shareSegments(gpu: Gpu, mine: ReadonlySet<string>): ShareSegment[] {
  const total = gpu.memory_mib;
  const segments: ShareSegment[] = (gpu.shares ?? []).map((share: Share) => {
    const memoryMib = share.kind === 'whole' ? total : share.memory_mib;
    return {
      memoryMib,
      fraction: memoryMib / total,
      owner: ownerOf(share.lease_id, mine),
      kind: share.kind,
      leaseId: share.lease_id ?? null,
      user: share.user ?? null
    };
  });
  const held = segments.reduce((sum, s) => sum + s.memoryMib, 0);
  const freeMib = Math.max(0, gpu.free_memory_mib ?? total - held);
  if (freeMib > 0) {
    segments.push({
      memoryMib: freeMib,
      fraction: freeMib / total,
      owner: 'free',
      kind: 'free',
      leaseId: null,
      user: null
    });
  }
  return segments;
}

/** A GPU's memory held and total in MiB (MIG: by memory slices). */
export function gpuMemory(gpu: Gpu): { usedMib: number; totalMib: number } {
  if (gpu.mig_mode !== 'off') {
    const total = memorySlices(gpu);
    const used = total - (gpu.free_memory_slices ?? total);
    return { usedMib: total ? (gpu.memory_mib * used) / total : 0, totalMib: gpu.memory_mib };
  }
  return { usedMib: gpu.memory_mib - (gpu.free_memory_mib ?? gpu.memory_mib), totalMib: gpu.memory_mib };
}

/** Why a GPU takes no new slices, or null: "drained" (the inventory has no per-GPU health). */
export function gpuCondition(gpu: Gpu): string | null {
  return gpu.drained ? 'drained' : null;
}
