/** Numbers and names as the sidebar and the status bar write them. */

import { jobOf, kernelOf, parseHolder } from './holders';
import { LeaseEntry, SliceInfo } from './types';

/** 9728 -> "9.5", 8192 -> "8", 4864 -> "4.75" (GiB, at most two decimals, as the kernel's
 * `%gpu status` writes them). */
export function gib(mib: number): string {
  return String(Math.round((mib / 1024) * 100) / 100);
}

/** What a queued request asks for: "1g.10gb", "8 GiB shared on L4", "10 GiB", "whole GPU", "2 whole L4". */
export function requestName(spec: LeaseEntry['spec']): string {
  const model = typeof spec.model === 'string' ? ` ${spec.model}` : '';
  if (typeof spec.profile === 'string') {
    return spec.profile;
  }
  const memory = typeof spec.memory_gib === 'number' ? `${gib(spec.memory_gib * 1024)} GiB` : null;
  if (spec.kind === 'whole') {
    const count = typeof spec.count === 'number' && spec.count > 1 ? spec.count : 1;
    return `${count > 1 ? `${count} ` : ''}whole ${model ? model.trim() : count > 1 ? 'GPUs' : 'GPU'}`;
  }
  if (memory) {
    return `${memory}${spec.kind === 'shared' ? ' shared' : ''}${model ? ` on${model}` : ''}`;
  }
  return `GPU slice${model ? ` on${model}` : ''}`;
}

/** "1g.10gb", "8 GiB shared", "whole A100 ×2". */
export function sliceName(slice: SliceInfo): string {
  if (slice.kind === 'mig' && slice.profile) {
    return slice.profile;
  }
  if (slice.kind === 'shared') {
    return `${gib(slice.memory_mib)} GiB shared`;
  }
  const count = slice.gpu_uuids.length;
  return `whole ${slice.model ?? 'GPU'}${count > 1 ? ` ×${count}` : ''}`;
}

/** The kernel id of a kernel's lease holder ("kernel:<id>"), else null. */
export function kernelOfHolder(holder: string): string | null {
  return kernelOf(holder);
}

/** Who holds a lease, for people: "kernel abc123…", "this server", "job 42". */
export function holderName(holder: string): string {
  const parsed = parseHolder(holder);
  if (parsed?.kind === 'kernel') {
    return `kernel ${parsed.name.slice(0, 8)}`;
  }
  if (parsed?.kind === 'job') {
    return `job ${parsed.name}`;
  }
  return parsed?.name ? `server ${parsed.name}` : 'this server';
}

/** What isolates a slice: "MIG", "MPS", "framework cap", "none". */
export function isolation(lease: LeaseEntry): string {
  const caps = lease.caps ?? [];
  if (caps.includes('mig')) {
    return 'MIG';
  }
  if (caps.includes('mps')) {
    return 'MPS';
  }
  if (caps.includes('hami-core')) {
    return 'HAMi-core';
  }
  if (caps.includes('framework')) {
    return 'framework cap';
  }
  return lease.slice?.kind === 'whole' ? 'whole GPU' : 'none';
}

/** The cap in force, strongest first, in words ("MIG hardware", "framework cap + watchdog"). */
export function capInForce(lease: LeaseEntry): string {
  const words: Record<string, string> = {
    mig: 'MIG hardware',
    mps: 'MPS limit',
    'hami-core': 'HAMi-core',
    framework: 'framework cap',
    watchdog: 'watchdog'
  };
  const caps = (lease.caps ?? []).map(c => words[c] ?? c);
  return caps.length ? caps.join(' + ') : 'none';
}

/** How a slice is held to its share, each mechanism once: "MIG hardware", "framework cap + watchdog",
 * "whole GPU" (the panel's "isolation: ..."; the isolation is the first of the caps in force). */
export function protection(lease: LeaseEntry): string {
  const caps = capInForce(lease);
  return caps === 'none' ? isolation(lease) : caps;
}

/** Whether GPU kernels run in pods of their own (a queued kernel's lease then holds back its start),
 * and the current notebook's kernel, whose wait is shown first. */
export interface KernelStarts {
  kernelPods: boolean;
  currentKernelId: string | null;
}

const NO_KERNEL_PODS: KernelStarts = { kernelPods: false, currentKernelId: null };

/** "waiting for a GPU slice: position 2" while a kernel of mine waits for its slice: the current
 * notebook's when it waits (a kernel starting for the first time is not known here yet), else the
 * first in line; null when none waits. */
export function kernelWaitText(slices: LeaseEntry[], currentKernelId: string | null): string | null {
  const waiting = slices.filter(l => l.state === 'queued' && kernelOfHolder(l.holder) !== null);
  const inLine = (lease: LeaseEntry) => lease.position ?? Infinity;
  const shown =
    waiting.find(l => currentKernelId !== null && kernelOfHolder(l.holder) === currentKernelId) ??
    [...waiting].sort((a, b) => inLine(a) - inLine(b))[0];
  if (!shown) {
    return null;
  }
  return shown.position ? `waiting for a GPU slice: position ${shown.position}` : 'waiting for a GPU slice';
}

/** The status bar's text: "GPU 1g.10gb · 3.1/9.5 GiB", "GPU 1g.10gb +1", "GPU queued #2" or "no GPU";
 * where GPU kernels run in pods of their own, "waiting for a GPU slice: position 2" while one waits to start. */
export function statusText(slices: LeaseEntry[], kernels: KernelStarts = NO_KERNEL_PODS): string {
  const waiting = kernels.kernelPods ? kernelWaitText(slices, kernels.currentKernelId) : null;
  if (waiting) {
    return waiting;
  }
  const granted = slices.filter(l => l.state === 'granted' && l.slice);
  if (granted.length === 0) {
    const queued = slices.find(l => l.state === 'queued');
    return queued ? `GPU queued #${queued.position ?? '?'}` : 'no GPU';
  }
  const first = granted[0];
  const slice = first.slice as SliceInfo;
  const memory =
    first.used_mib !== null && first.used_mib !== undefined
      ? `${gib(first.used_mib)}/${gib(slice.memory_mib)} GiB`
      : `${gib(slice.memory_mib)} GiB`;
  const more = granted.length > 1 ? ` +${granted.length - 1}` : '';
  return `GPU ${sliceName(slice)} · ${memory}${more}`;
}

/** Where this tab stands with its server: `loading` until the first answer, `on`, `off` (GPU features
 * are off on the server) or `stopped` (the server no longer answers). */
export type ServerPhase = 'loading' | 'on' | 'off' | 'stopped';

/** The status bar's text in every phase: "…" until the first answer (never "no GPU" before it is known),
 * "GPU off", "server stopped", else statusText's. */
export function statusBarText(phase: ServerPhase, slices: LeaseEntry[], kernels: KernelStarts = NO_KERNEL_PODS): string {
  switch (phase) {
    case 'loading':
      return '…';
    case 'off':
      return 'GPU off';
    case 'stopped':
      return 'server stopped';
    default:
      return statusText(slices, kernels);
  }
}

/** The status bar's tooltip: each granted slice and its holder ("+1" counts the slices after the first). */
export function statusTitle(slices: LeaseEntry[]): string {
  const granted = slices.filter(l => l.state === 'granted' && l.slice);
  const held = granted.map(l => `${sliceName(l.slice as SliceInfo)} (${holderName(l.holder)})`);
  const queued = slices.filter(l => l.state === 'queued').length;
  const lines = held.length ? [`Your GPU slices: ${held.join(', ')}`] : ['You hold no GPU slice'];
  if (queued) {
    lines.push(`${queued} request${queued > 1 ? 's' : ''} queued`);
  }
  return [...lines, 'Click to open the GPUs panel'].join('\n');
}

/** A question asked before an action that cannot be undone: `accept` is the text of its warn button. */
export interface Question {
  title: string;
  body: string;
  accept: string;
}

/** The question asked before releasing a slice, or null when it needs none: releasing the slice
 * of a JupyterHub server stops that server (its kernels end), and releasing the slice of a kernel
 * of this server (`lease.kernel`; `notebook`: its notebook, when open) shuts that kernel down. */
export function releaseQuestion(lease: LeaseEntry, notebook: string | null = null): Question | null {
  const [kind] = lease.holder.split(':', 1);
  if (lease.state !== 'granted') {
    return null;
  }
  if (kind === 'kernel' && lease.kernel) {
    const what = notebook ? `the kernel of ${notebook}` : 'this kernel';
    return {
      title: `Release the GPU slice of ${notebook ?? 'this kernel'}?`,
      body:
        `The kernel runs on this slice, so releasing it shuts ${what} down: its variables are lost. ` +
        'The slice returns to the pool once the kernel has stopped; start the kernel again from the Kernel menu.',
      accept: 'Release and shut down the kernel'
    };
  }
  if (kind !== 'server') {
    return null;
  }
  return {
    title: 'Release the GPU slice of this server?',
    body:
      'The server runs on this slice, so releasing it stops the server: its kernels end and what ' +
      'is not saved is lost. Start it again from File → Hub Control Panel.',
    accept: 'Release and stop the server'
  };
}

/** A notice about a kernel, naming its notebook: "kernel <id>" -> "train.ipynb",
 * "Kernel <id>" -> "The kernel of train.ipynb". */
export function namedAfterNotebook(message: string, kernelId: string, notebook: string): string {
  return message.replace(`Kernel ${kernelId}`, `The kernel of ${notebook}`).replace(`kernel ${kernelId}`, notebook);
}

/** A notice about a job's lease, naming the job: "job 01b9a677245b" -> "job train-resnet" (`name`: its name). */
export function namedAfterJob(message: string, holder: string | undefined, name: string | undefined): string {
  const id = holder ? jobOf(holder) : null;
  if (!id || !name || name === id) {
    return message;
  }
  return message.split(`job:${id}`).join(`job ${name}`).split(`job ${id}`).join(`job ${name}`).split(`Job ${id}`).join(`Job ${name}`);
}
