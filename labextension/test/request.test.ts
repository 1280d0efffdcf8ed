import { describe, expect, it } from 'vitest';

import { requestHint } from '../src/model/request';

const REFUSED = {
  kernel: 'on Kubernetes a kernel cannot get a GPU slice: a running pod cannot gain a device, and GPU kernels need kernel pods of their own, which are not available yet; start your server with a GPU instead'
};

describe('requestHint', () => {
  it('says why a kernel gets no slice here before anyone asks, whatever is open', () => {
    expect(requestHint(null, null, false, REFUSED)).toBe(REFUSED.kernel);
    expect(requestHint('a.ipynb', 'k1', false, REFUSED)).toBe(REFUSED.kernel);
  });

  it('is empty when the open notebook has a kernel without a slice and kernels may get one', () => {
    expect(requestHint('a.ipynb', 'k1', false, {})).toBe('');
    expect(requestHint('a.ipynb', 'k1', false, { job: 'jobs cannot' })).toBe('');
  });

  it('says what is missing otherwise', () => {
    expect(requestHint(null, null, false, {})).toBe('Open a notebook to request a slice for its kernel.');
    expect(requestHint('a.ipynb', null, false, {})).toBe('a.ipynb has no running kernel.');
    expect(requestHint('a.ipynb', 'k1', true, {})).toBe('The kernel of a.ipynb already has a slice or a request.');
  });
});
