import { describe, expect, it } from 'vitest';

import {
  KernelRules,
  requestAction,
  requestButtonLabel,
  requestButtonText,
  restartNoteOf,
  restartQuestion,
  settleRestarts
} from '../src/model/request';
import { Offer } from '../src/model/types';
import { kernelLease } from './leases';

const REFUSED = {
  kernel: 'on Kubernetes a kernel cannot get a GPU slice: a running pod cannot gain a device, and GPU kernels need kernel pods of their own, which are not available yet; start your server with a GPU instead'
};
const IN_A_POD = { kernel: 'on Kubernetes a running kernel cannot get a GPU slice: start a GPU kernel instead' };

const ONE_MACHINE: KernelRules = { refusedHolders: {}, kernelPods: false };
const NO_KERNEL_PODS: KernelRules = { refusedHolders: REFUSED, kernelPods: false };
const KERNEL_PODS: KernelRules = { refusedHolders: IN_A_POD, kernelPods: true };

const OFFER: Offer = { name: 'mig-1g', label: '1g.10gb', spec: { kind: 'mig', profile: '1g.10gb' }, available: 2 };

describe('the Request button on one machine', () => {
  it('asks for a slice for the open notebook’s running kernel', () => {
    expect(requestAction('a.ipynb', 'k1', false, ONE_MACHINE)).toEqual({
      kind: 'request',
      notebookPath: 'a.ipynb',
      kernelId: 'k1'
    });
    expect(requestAction('a.ipynb', 'k1', false, { ...ONE_MACHINE, refusedHolders: { job: 'jobs cannot' } }).kind).toBe(
      'request'
    );
    expect(requestButtonText(ONE_MACHINE)).toBe('Request for this notebook');
    expect(requestButtonLabel(ONE_MACHINE, 'a.ipynb', OFFER)).toBe('Request 1g.10gb for a.ipynb');
    expect(requestButtonLabel(ONE_MACHINE, null, OFFER)).toBe('Request a slice');
  });

  it('says what is missing otherwise', () => {
    expect(requestAction(null, null, false, ONE_MACHINE)).toEqual({
      kind: 'none',
      why: 'Open a notebook to request a slice for its kernel.'
    });
    expect(requestAction('a.ipynb', null, false, ONE_MACHINE)).toEqual({
      kind: 'none',
      why: 'a.ipynb has no running kernel.'
    });
    expect(requestAction('a.ipynb', 'k1', true, ONE_MACHINE)).toEqual({
      kind: 'none',
      why: 'The kernel of a.ipynb already has a slice or a request.'
    });
  });
});

describe('the Request button on Kubernetes without kernel pods', () => {
  it('says why a kernel gets no slice here before anyone asks, whatever is open', () => {
    for (const [path, kernel] of [
      [null, null],
      ['a.ipynb', null],
      ['a.ipynb', 'k1']
    ]) {
      expect(requestAction(path, kernel, false, NO_KERNEL_PODS)).toEqual({ kind: 'none', why: REFUSED.kernel });
    }
    expect(requestButtonText(NO_KERNEL_PODS)).toBe('Request for this notebook');
  });
});

describe('the Request button where GPU kernels run in pods of their own', () => {
  it('restarts the open notebook’s kernel as a GPU kernel, though a running kernel is refused a slice', () => {
    expect(requestAction('a.ipynb', 'k1', false, KERNEL_PODS)).toEqual({
      kind: 'restart',
      notebookPath: 'a.ipynb',
      kernelId: 'k1'
    });
    expect(requestButtonText(KERNEL_PODS)).toBe('Restart as a GPU kernel…');
    expect(requestButtonLabel(KERNEL_PODS, 'a.ipynb', OFFER)).toBe('Restart a.ipynb as a GPU kernel with 1g.10gb');
    expect(requestButtonLabel(KERNEL_PODS, null, OFFER)).toBe('Restart as a GPU kernel');
  });

  it('offers nothing without a notebook kernel (never a slice for the server), nor twice for one kernel', () => {
    expect(requestAction(null, null, false, KERNEL_PODS)).toEqual({
      kind: 'none',
      why: 'Open a notebook to restart its kernel as a GPU kernel.'
    });
    expect(requestAction('a.ipynb', null, false, KERNEL_PODS)).toEqual({
      kind: 'none',
      why: 'a.ipynb has no running kernel.'
    });
    expect(requestAction('a.ipynb', 'k1', true, KERNEL_PODS)).toEqual({
      kind: 'none',
      why: 'The kernel of a.ipynb already has a slice or a request.'
    });
  });

  it('asks first, saying the variables are lost and the kernel may wait for its slice', () => {
    const question = restartQuestion('a.ipynb', OFFER);
    expect(question.title).toBe('Restart a.ipynb as a GPU kernel?');
    expect(question.body).toBe(
      'A GPU kernel on Kubernetes runs in a pod of its own, so the kernel of this notebook restarts: its ' +
        'variables are lost and its cells need to run again. It may still wait in the queue for the 1g.10gb slice.'
    );
    expect(question.accept).toBe('Restart with 1g.10gb');
    expect(restartQuestion('a.ipynb', { ...OFFER, available: 0 }).body).toMatch(
      /No 1g\.10gb slice is free now: it waits in the queue for one\.$/
    );
  });
});

describe('pending restarts as GPU kernels', () => {
  const asked = { k1: { note: 'restarting in a pod of its own', leaseSeen: false } };

  it('stay until the kernel’s lease is listed, and while it waits', () => {
    expect(settleRestarts(asked, [])).toEqual(asked);
    expect(settleRestarts(asked, [kernelLease('other', 'granted')])).toEqual(asked);
    const waiting = settleRestarts(asked, [kernelLease('k1', 'queued', 2)]);
    expect(waiting).toEqual({ k1: { note: 'restarting in a pod of its own', leaseSeen: true } });
    expect(restartNoteOf(waiting, kernelLease('k1', 'queued', 2))).toBe('restarting in a pod of its own');
    expect(restartNoteOf(waiting, kernelLease('k2', 'queued', 2))).toBeUndefined();
    expect(restartNoteOf(waiting, { ...kernelLease('k1', 'queued'), holder: 'server' })).toBeUndefined();
  });

  it('are over once the slice is granted, or once the listed request is gone', () => {
    expect(settleRestarts(asked, [kernelLease('k1', 'granted')])).toEqual({});
    const waiting = settleRestarts(asked, [kernelLease('k1', 'queued', 1)]);
    expect(settleRestarts(waiting, [])).toEqual({});
  });
});
