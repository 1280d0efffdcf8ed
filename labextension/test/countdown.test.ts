import { describe, expect, it } from 'vitest';

import { formatCountdown, formatDuration, secondsLeft } from '../src/model/countdown';
import { kernelWaitText, namedAfterNotebook, releaseQuestion, statusText, statusTitle } from '../src/model/format';
import { LeaseEntry } from '../src/model/types';

describe('idle countdown', () => {
  it('counts whole seconds down to the release and stops at zero', () => {
    expect(secondsLeft(100, 40_000)).toBe(60);
    expect(secondsLeft(100, 99_001)).toBe(1);
    expect(secondsLeft(100, 100_000)).toBe(0);
    expect(secondsLeft(100, 500_000)).toBe(0);
  });

  it('writes minutes and seconds, and hours when there are some', () => {
    expect(formatCountdown(0)).toBe('0:00');
    expect(formatCountdown(75)).toBe('1:15');
    expect(formatCountdown(3725)).toBe('1:02:05');
  });

  it('measures a running time until now, or until its end', () => {
    expect(formatDuration(null, null, 0)).toBe('—');
    expect(formatDuration(10, null, 70_000)).toBe('1:00');
    expect(formatDuration(10, 20, 70_000)).toBe('0:10');
  });
});

describe('status-bar text', () => {
  const granted: LeaseEntry = {
    id: 'a',
    user: 'me',
    holder: 'kernel:k',
    spec: {},
    priority: 'interactive',
    state: 'granted',
    slice: {
      kind: 'mig',
      node: 'ws',
      gpu_uuids: ['GPU-a'],
      memory_mib: 9728,
      profile: '1g.10gb',
      visible_devices: 'MIG-1'
    },
    created_at: 0,
    reason: '',
    position: null
  };

  it('says "no GPU", a queue position, or the slice with its memory', () => {
    expect(statusText([])).toBe('no GPU');
    expect(statusText([{ ...granted, state: 'queued', slice: null, position: 3 }])).toBe('GPU queued #3');
    expect(statusText([granted])).toBe('GPU 1g.10gb · 9.5 GiB');
    expect(statusText([{ ...granted, used_mib: 3174 }])).toBe('GPU 1g.10gb · 3.1/9.5 GiB');
    expect(statusText([granted, { ...granted, id: 'b' }])).toBe('GPU 1g.10gb · 9.5 GiB +1');
  });

  it('shows a GPU kernel’s wait for its slice first where kernels run in pods of their own', () => {
    const queued = (id: string, kernelId: string, position: number | null): LeaseEntry => ({
      ...granted,
      id,
      holder: `kernel:${kernelId}`,
      state: 'queued',
      slice: null,
      position
    });
    const pods = { kernelPods: true, currentKernelId: null };
    // the lowest position when the current notebook's kernel does not wait (a first start is not known yet)
    const server = { ...queued('s', 'x', 1), holder: 'server' };
    const slices = [granted, queued('b', 'k-b', 3), queued('c', 'k-c', 2), server];
    expect(statusText(slices, pods)).toBe('waiting for a GPU slice: position 2');
    expect(statusText(slices, { kernelPods: true, currentKernelId: 'k-other' })).toBe(
      'waiting for a GPU slice: position 2'
    );
    // the current notebook's kernel when it waits
    expect(statusText(slices, { kernelPods: true, currentKernelId: 'k-b' })).toBe(
      'waiting for a GPU slice: position 3'
    );
    expect(kernelWaitText([queued('b', 'k-b', null), queued('c', 'k-c', 4)], null)).toBe(
      'waiting for a GPU slice: position 4'
    );
    expect(kernelWaitText([queued('b', 'k-b', null)], null)).toBe('waiting for a GPU slice');
    // no kernel waits: the slices as before
    expect(statusText([granted, server], pods)).toBe('GPU 1g.10gb · 9.5 GiB');
    // on one machine a kernel's queued request reads as before
    expect(statusText(slices)).toBe('GPU 1g.10gb · 9.5 GiB');
    expect(statusText([queued('b', 'k-b', 3)])).toBe('GPU queued #3');
  });

  it('explains "+1" in its tooltip: each slice and who holds it', () => {
    const kernel = { ...granted, id: 'b', holder: 'kernel:0123456789ab' };
    expect(statusTitle([{ ...granted, holder: 'server' }, kernel])).toBe(
      'Your GPU slices: 1g.10gb (this server), 1g.10gb (kernel 01234567)\nClick to open the GPUs panel'
    );
    expect(statusTitle([{ ...granted, state: 'queued', slice: null }])).toBe(
      'You hold no GPU slice\n1 request queued\nClick to open the GPUs panel'
    );
  });

  it("asks before releasing a server's slice: that stops the server", () => {
    const question = releaseQuestion({ ...granted, holder: 'server' });
    expect(question?.body).toContain('stops the server');
    expect(releaseQuestion({ ...granted, holder: 'server:gpu2' })?.accept).toBe('Release and stop the server');
  });

  it("asks before releasing the slice of a kernel of this server: that shuts the kernel down", () => {
    const ref = { id: 'k-1', name: 'python3', execution_state: 'idle' };
    const kernel = { ...granted, holder: 'kernel:k-1', kernel: ref };
    const question = releaseQuestion(kernel, 'train.ipynb');
    expect(question?.title).toBe('Release the GPU slice of train.ipynb?');
    expect(question?.body).toContain('shuts the kernel of train.ipynb down: its variables are lost');
    expect(question?.accept).toBe('Release and shut down the kernel');
    expect(releaseQuestion(kernel)?.body).toContain('shuts this kernel down');
  });

  it("asks nothing before releasing a job's slice, a kernel's held elsewhere, or a queued request", () => {
    expect(releaseQuestion({ ...granted, holder: 'kernel:k-1' })).toBeNull();
    expect(releaseQuestion({ ...granted, holder: 'job:7' })).toBeNull();
    expect(releaseQuestion({ ...granted, holder: 'server', state: 'queued' })).toBeNull();
    const ref = { id: 'k-1', name: 'python3', execution_state: 'idle' };
    expect(releaseQuestion({ ...granted, holder: 'kernel:k-1', state: 'queued', kernel: ref }, 'a.ipynb')).toBeNull();
  });
});

describe('notices about a kernel', () => {
  it('name its notebook instead of the kernel id', () => {
    expect(namedAfterNotebook('The GPU slice of kernel k-1 was extended.', 'k-1', 'a.ipynb')).toBe(
      'The GPU slice of a.ipynb was extended.'
    );
    expect(namedAfterNotebook('Kernel k-1 was shut down: its GPU lease expired.', 'k-1', 'a.ipynb')).toBe(
      'The kernel of a.ipynb was shut down: its GPU lease expired.'
    );
    expect(namedAfterNotebook('Kernel k-2 was shut down.', 'k-1', 'a.ipynb')).toBe('Kernel k-2 was shut down.');
  });
});
