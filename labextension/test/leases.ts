/** Leases for the tests: a kernel's lease for a 1g.10gb slice. */
import { LeaseEntry } from '../src/model/types';

export function kernelLease(kernelId: string, state: 'queued' | 'granted', position: number | null = null): LeaseEntry {
  return {
    id: `lease-${kernelId}`,
    user: 'me',
    holder: `kernel:${kernelId}`,
    spec: { kind: 'mig', profile: '1g.10gb' },
    priority: 'interactive',
    state,
    slice: null,
    created_at: 0,
    reason: '',
    position
  };
}
