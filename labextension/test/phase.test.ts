/**
 * The model with GPU features off on its server, and after its server stopped: it shows why, stops
 * fetching and listening, and asks the server again only now and then (a fake API counts the calls).
 */

import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';

vi.mock('@jupyterlab/apputils', () => ({ Notification: { emit: vi.fn(), dismiss: vi.fn() } }));
vi.mock('@jupyterlab/services', () => ({ ServerConnection: { makeRequest: vi.fn() } }));

import { GpuApi } from '../src/api';
import { GpuModel, OFF_RECHECK_SECONDS, POLL_SECONDS } from '../src/gpumodel';
import { ServerStopped } from '../src/model/errors';
import { statusBarText } from '../src/model/format';
import { LeaseEntry, ServerStatus } from '../src/model/types';
import { kernelLease } from './leases';

const SLICE = { kind: 'mig' as const, node: 'ws', gpu_uuids: ['GPU-a'], memory_mib: 4864, profile: '1g.5gb',
  visible_devices: 'MIG-1' };
const OFF_REASON = 'GPU slices and jobs are off: no GPU was found and no fleet file is configured.';

function fakeApi() {
  const fake = {
    status: { mode: 'embedded' } as ServerStatus,
    stopped: false,
    slices: [{ ...kernelLease('k', 'granted'), slice: SLICE }] as LeaseEntry[],
    calls: {} as Record<string, number>,
    streams: [] as { closed: boolean }[]
  };
  const answer =
    <T>(name: string, value: () => T) =>
    async (): Promise<T> => {
      fake.calls[name] = (fake.calls[name] ?? 0) + 1;
      if (fake.stopped) {
        throw new ServerStopped('no answer (Failed to fetch)');
      }
      return value();
    };
  const api = {
    status: answer('status', () => fake.status),
    inventory: answer('inventory', () => ({ nodes: [], queue: {} })),
    offers: answer('offers', () => ({ offers: [], refused_holders: {} })),
    slices: answer('slices', () => fake.slices),
    usage: answer('usage', () => null),
    reservations: answer('reservations', () => []),
    jobs: answer('jobs', () => []),
    events: () => {
      const stream = { closed: false, close: () => (stream.closed = true) };
      fake.streams.push(stream);
      return stream;
    }
  };
  return { fake, model: new GpuModel(api as unknown as GpuApi) };
}

/** Let the calls the model makes in the background answer. */
const settled = () => vi.advanceTimersByTimeAsync(0);
const fetches = (calls: Record<string, number>) => (calls.inventory ?? 0) + (calls.slices ?? 0) + (calls.jobs ?? 0);

describe('a server with GPU features off, and one that stopped', () => {
  beforeEach(() => {
    vi.useFakeTimers();
    vi.stubGlobal('window', globalThis);
  });
  afterEach(() => {
    vi.useRealTimers();
    vi.unstubAllGlobals();
  });

  it('shows "…" until the first answer, then my slices', async () => {
    const { model } = fakeApi();
    expect(statusBarText(model.phase, model.slices)).toBe('…');
    model.start();
    await settled();
    expect(model.phase).toBe('on');
    expect(statusBarText(model.phase, model.slices)).toBe('GPU 1g.5gb · 4.75 GiB');
    model.dispose();
  });

  it('with GPU off, says why, fetches nothing else and asks again once a minute', async () => {
    const { fake, model } = fakeApi();
    fake.status = { mode: 'off', reason: OFF_REASON };
    model.start();
    await settled();
    expect([model.phase, model.offReason]).toEqual(['off', OFF_REASON]);
    await vi.advanceTimersByTimeAsync(5 * 60_000);
    expect(fetches(fake.calls)).toBe(0);
    expect(fake.streams).toEqual([]);
    expect(fake.calls.status).toBe(1 + (5 * 60) / OFF_RECHECK_SECONDS);
    // turned on meanwhile: a person's click finds it at once
    fake.status = { mode: 'embedded' };
    await model.recheck();
    await settled();
    expect(model.phase).toBe('on');
    expect(fetches(fake.calls)).toBeGreaterThan(0);
    model.dispose();
  });

  it('after the server stopped, drops its slices and the stream and backs off', async () => {
    const { fake, model } = fakeApi();
    model.start();
    await settled();
    expect(model.slices).toHaveLength(1);
    expect(fake.streams).toHaveLength(1);
    fake.stopped = true;
    await vi.advanceTimersByTimeAsync(POLL_SECONDS * 1000); // the poll of a held slice finds it gone
    expect(model.phase).toBe('stopped');
    expect(model.slices).toEqual([]);
    expect(model.connected).toBe(false);
    expect(fake.streams[0].closed).toBe(true);
    expect(statusBarText(model.phase, model.slices)).toBe('server stopped');
    const before = { ...fake.calls };
    await vi.advanceTimersByTimeAsync(10 * 60_000);
    expect(fetches(fake.calls)).toBe(fetches(before)); // the slices, fleet and jobs are not asked for
    // after 10 s, 20 s, 40 s, 80 s, 160 s (then 300 s): 5 checks in 10 minutes, not 60 rounds of five fetches
    expect(fake.calls.status - before.status).toBe(5);
    fake.stopped = false;
    await model.recheck();
    await settled();
    expect(model.phase).toBe('on');
    expect(model.slices).toHaveLength(1);
    model.dispose();
  });
});
