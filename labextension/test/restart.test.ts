/**
 * Restarting a notebook's kernel as a GPU kernel (Kubernetes kernel pods), through the panel's model
 * with a fake API, and the request the API client sends for it.
 */

import { beforeEach, describe, expect, it, vi } from 'vitest';

// the notifications and the server connection need a browser: the model and the client get fakes
const { makeRequest } = vi.hoisted(() => ({ makeRequest: vi.fn() }));
vi.mock('@jupyterlab/apputils', () => ({ Notification: { emit: vi.fn(), dismiss: vi.fn() } }));
vi.mock('@jupyterlab/services', () => ({ ServerConnection: { makeRequest } }));

import { GpuApi } from '../src/api';
import { GpuModel } from '../src/gpumodel';
import { ApiError } from '../src/model/errors';
import { Question } from '../src/model/format';
import { KernelRestart, LeaseEntry, Offer, OfferSheet } from '../src/model/types';
import { kernelLease } from './leases';

const OFFER: Offer = { name: 'mig-1g', label: '1g.10gb', spec: { kind: 'mig', profile: '1g.10gb' }, available: 0 };
const NOTE = 'the kernel of a.ipynb restarts in a pod of its own with a 1g.10gb slice';

/** Let the fetch the model starts after each call (in the background) finish first. */
const settled = () => new Promise(resolve => setTimeout(resolve));

/** The API calls the model makes, answered from `sheet` and `slices`; `restart` answers the restart. */
function fakeApi() {
  const fake = {
    sheet: {
      offers: [OFFER],
      refused_holders: { kernel: 'a running kernel cannot get a GPU slice' },
      kernel_pods: true
    } as OfferSheet,
    slices: [] as LeaseEntry[],
    restart: vi.fn(
      async (offer: string, kernelId: string): Promise<KernelRestart> => ({
        kernel_id: kernelId,
        restarting: true,
        offer,
        note: NOTE
      })
    ),
    request: vi.fn()
  };
  const api = {
    inventory: async () => ({ nodes: [], queue: {} }),
    offers: async () => fake.sheet,
    slices: async () => fake.slices,
    usage: async () => null,
    reservations: async () => [],
    restartAsGpuKernel: fake.restart,
    request: fake.request
  };
  return { fake, model: new GpuModel(api as unknown as GpuApi) };
}

describe('restarting a kernel as a GPU kernel', () => {
  it('reads from the offers sheet that GPU kernels run in pods of their own', async () => {
    const { fake, model } = fakeApi();
    await model.refresh();
    expect(model.kernelRules).toEqual({ refusedHolders: fake.sheet.refused_holders, kernelPods: true });
    fake.sheet = { offers: [OFFER], refused_holders: {} };
    await model.refresh();
    expect(model.kernelPods).toBe(false);
  });

  it('asks first, and does nothing when the answer is Cancel', async () => {
    const { fake, model } = fakeApi();
    const asked: Question[] = [];
    const answer = await model.restartAsGpuKernel(OFFER, 'a.ipynb', 'k1', async question => {
      asked.push(question);
      return false;
    });
    expect(answer).toBeNull();
    expect(asked.map(q => q.accept)).toEqual(['Restart with 1g.10gb']);
    expect(asked[0].body).toContain('runs in a pod of its own');
    expect(asked[0].body).toContain('its variables are lost');
    expect(fake.restart).not.toHaveBeenCalled();
    expect(fake.request).not.toHaveBeenCalled();
    expect(model.restarts).toEqual({});
  });

  it('on Restart, asks the server to restart the kernel and shows its note until the slice is granted', async () => {
    const { fake, model } = fakeApi();
    const answer = await model.restartAsGpuKernel(OFFER, 'a.ipynb', 'k1', async () => true);
    expect(fake.restart).toHaveBeenCalledWith('mig-1g', 'k1');
    expect(fake.request).not.toHaveBeenCalled();
    expect(answer?.restarting).toBe(true);
    expect(model.error).toBeNull();
    expect(model.restarts).toEqual({ k1: { note: NOTE, leaseSeen: false } });
    await settled();
    expect(model.restarts).toEqual({ k1: { note: NOTE, leaseSeen: false } });

    // the restarted kernel waits in the queue for its slice: the note stays beside its lease
    fake.slices = [kernelLease('k1', 'queued', 2)];
    await model.refresh();
    expect(model.restarts.k1).toEqual({ note: NOTE, leaseSeen: true });

    // granted (the event stream says so first): the note is over
    model.handle({ type: 'lease.granted', lease_id: 'lease-k1', holder: 'kernel:k1' });
    expect(model.slices[0].state).toBe('granted');
    expect(model.restarts).toEqual({});
  });

  it('drops the note when the waiting request is withdrawn or refused', async () => {
    const { fake, model } = fakeApi();
    await model.restartAsGpuKernel(OFFER, 'a.ipynb', 'k1', async () => true);
    await settled();
    fake.slices = [kernelLease('k1', 'queued', 1)];
    await model.refresh();
    model.handle({ type: 'lease.rejected', lease_id: 'lease-k1', holder: 'kernel:k1', state: 'rejected' });
    expect(model.slices).toEqual([]);
    expect(model.restarts).toEqual({});
  });

  it('says in plain words why the server refused, as for other refused calls', async () => {
    const { fake, model } = fakeApi();
    fake.restart.mockRejectedValueOnce(new ApiError(409, 'kernel k1 is already restarting'));
    const answer = await model.restartAsGpuKernel(OFFER, 'a.ipynb', 'k1', async () => true);
    expect(answer).toBeNull();
    expect(model.error).toBe('Not possible right now: kernel k1 is already restarting');
    expect(model.restarts).toEqual({});
  });
});

describe('a slice requested for a running kernel (no kernel pods)', () => {
  const TOLD = 'the kernel uses the slice from its next cell';

  it("shows the server's note until the listing says the kernel applied the slice", async () => {
    const { fake, model } = fakeApi();
    const granted = kernelLease('k1', 'granted');
    fake.request.mockResolvedValueOnce({ ...granted, note: TOLD });
    fake.slices = [{ ...granted, note: TOLD }];
    await model.request('mig-1g', 'k1');
    await settled();
    expect(model.notes).toEqual({ 'lease-k1': TOLD });

    // the kernel answered that CUDA runs in it: the listing's note replaces the first one
    const restart = 'restart the kernel to use the slice: CUDA already runs in it on another GPU';
    fake.slices = [{ ...granted, note: restart }];
    await model.refresh();
    expect(model.notes).toEqual({ 'lease-k1': restart });

    // in effect (or ended): no note, so no Restart kernel button
    fake.slices = [granted];
    await model.refresh();
    expect(model.notes).toEqual({});
  });
});

describe('the API client', () => {
  beforeEach(() => makeRequest.mockReset());
  const api = new GpuApi({ baseUrl: 'http://lab/user/me/' } as never, '/home/me');

  it('posts the offer, the kernel and restart: true to the request endpoint, and returns the 202 answer', async () => {
    const restart = { kernel_id: 'k1', restarting: true, offer: 'mig-1g', note: NOTE };
    makeRequest.mockResolvedValueOnce(new Response(JSON.stringify(restart), { status: 202 }));
    expect(await api.restartAsGpuKernel('mig-1g', 'k1')).toEqual(restart);
    const [url, init] = makeRequest.mock.calls[0];
    expect(url).toBe('http://lab/user/me/gpualloc/api/request?no_track_activity=1');
    expect(init.method).toBe('POST');
    expect(JSON.parse(init.body)).toEqual({ offer: 'mig-1g', kernel_id: 'k1', restart: true });
  });

  it("turns a 4xx into an ApiError with the server's message", async () => {
    makeRequest.mockResolvedValueOnce(
      new Response(JSON.stringify({ message: 'no kernel k9 on this server' }), { status: 404 })
    );
    const refusal = api.restartAsGpuKernel('mig-1g', 'k9');
    await expect(refusal).rejects.toBeInstanceOf(ApiError);
    await expect(refusal).rejects.toMatchObject({ status: 404, message: 'no kernel k9 on this server' });
  });
});
