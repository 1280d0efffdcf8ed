/**
 * The sidebar's client of the server extension's sidebar API under `<base_url>gpualloc/api/`,
 * which answers alike in embedded mode and under JupyterHub (jobs are REST API v1's, relayed).
 * Every request carries `no_track_activity=1`, so an open panel never keeps the server "active"
 * for an idle culler.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ApiError, notTheServer, ServerStopped } from './model/errors';
import { notebookJob } from './model/jobs';
import { streamQuery } from './model/stream';
import {
  GpuEvent,
  Inventory,
  Job,
  KernelRestart,
  LeaseEntry,
  OfferSheet,
  Reservation,
  ServerStatus,
  UsageReport
} from './model/types';

/** The sidebar API's path below the server's base URL. */
const ROOT = 'gpualloc/api';

export class GpuApi {
  /** `serverRoot`: the server's root directory, absolute (JupyterLab's page config gives it). */
  constructor(
    readonly settings: ServerConnection.ISettings,
    readonly serverRoot: string
  ) {}

  url(path: string, query: Record<string, string> = {}): string {
    const params = new URLSearchParams({ ...query, no_track_activity: '1' });
    return `${URLExt.join(this.settings.baseUrl, path)}?${params}`;
  }

  /** A call of the API: its JSON answer; ApiError when refused, ServerStopped when the server is gone. */
  async call<T>(path: string, init: RequestInit = {}, query: Record<string, string> = {}): Promise<T> {
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(this.url(path, query), init, this.settings);
    } catch (err) {
      throw new ServerStopped(`no answer (${(err as Error)?.message ?? err})`);
    }
    const text = await response.text();
    let body: any = null;
    let json = false;
    try {
      body = text ? JSON.parse(text) : null;
      json = body !== null;
    } catch {
      body = null;
    }
    if (!response.ok && notTheServer(response.status, json)) {
      throw new ServerStopped(`${response.status} ${response.statusText}`.trim());
    }
    if (!response.ok) {
      const reason = body?.message || body?.error || body?.reason || response.statusText;
      throw new ApiError(response.status, String(reason));
    }
    return body as T;
  }

  private post<T>(path: string, body: unknown): Promise<T> {
    return this.call<T>(path, { method: 'POST', body: JSON.stringify(body) });
  }

  /** Whether GPU features are on here (`mode` "off" with the reason when not). */
  status(): Promise<ServerStatus> {
    return this.call<ServerStatus>(`${ROOT}/status`);
  }

  inventory(): Promise<Inventory> {
    return this.call<Inventory>(`${ROOT}/inventory`);
  }

  offers(): Promise<OfferSheet> {
    return this.call<OfferSheet>(`${ROOT}/offers`);
  }

  async reservations(): Promise<Reservation[]> {
    return (await this.call<{ reservations: Reservation[] }>(`${ROOT}/reservations`)).reservations;
  }

  async slices(): Promise<LeaseEntry[]> {
    return (await this.call<{ slices: LeaseEntry[] }>(`${ROOT}/slices`)).slices;
  }

  /** Ask for an offer's slice for a kernel of this server (queued when nothing fits now). */
  request(offer: string, kernelId: string): Promise<LeaseEntry> {
    return this.post<LeaseEntry>(`${ROOT}/request`, { offer, kernel_id: kernelId });
  }

  /** Restart a kernel of this server as a GPU kernel with an offer's slice, in a pod of its own (Kubernetes
   * kernel pods): the server restarts it, and the open kernel connection reconnects to the new pod. */
  restartAsGpuKernel(offer: string, kernelId: string): Promise<KernelRestart> {
    return this.post<KernelRestart>(`${ROOT}/request`, { offer, kernel_id: kernelId, restart: true });
  }

  /** Release a granted slice, or withdraw a queued request. */
  release(leaseId: string): Promise<LeaseEntry> {
    return this.post<LeaseEntry>(`${ROOT}/release`, { lease_id: leaseId });
  }

  /** Keep an idle-warned slice: count now as the holder's activity, which clears the idle warning. */
  keep(leaseId: string): Promise<LeaseEntry> {
    return this.post<LeaseEntry>(`${ROOT}/extend`, { lease_id: leaseId });
  }

  /** Move a time-boxed slice's deadline later (409 with the reason when refused). */
  extendDeadline(leaseId: string): Promise<LeaseEntry> {
    return this.post<LeaseEntry>(`${ROOT}/deadline/extend`, { lease_id: leaseId });
  }

  /** My GPU-hours this month and where I stand against my usage quotas. */
  usage(): Promise<UsageReport> {
    return this.call<UsageReport>(`${ROOT}/usage`);
  }

  async jobs(): Promise<Job[]> {
    return (await this.call<{ jobs: Job[] }>(`${ROOT}/jobs`)).jobs;
  }

  /** Run a notebook (path under the server's root) as a background job on a slice of `spec`. */
  submitJob(notebook: string, spec: Record<string, unknown>): Promise<Job> {
    return this.post<Job>(`${ROOT}/jobs`, notebookJob(notebook, this.serverRoot, spec));
  }

  cancelJob(id: string): Promise<Job> {
    return this.call<Job>(`${ROOT}/jobs/${encodeURIComponent(id)}`, { method: 'DELETE' });
  }

  rerunJob(id: string): Promise<Job> {
    return this.post<Job>(`${ROOT}/jobs/${encodeURIComponent(id)}/rerun`, {});
  }

  /** A notebook job's executed notebook (nbformat JSON). */
  executedNotebook(id: string): Promise<Record<string, unknown>> {
    return this.call(`${ROOT}/jobs/${encodeURIComponent(id)}/executed`);
  }

  /** A job's log as it grows: `onText` gets each new piece; the returned function stops reading. */
  followLog(id: string, onText: (text: string) => void, onEnd: (error?: string) => void): () => void {
    const controller = new AbortController();
    const url = this.url(`${ROOT}/jobs/${encodeURIComponent(id)}/log`, { follow: '1' });
    ServerConnection.makeRequest(url, { signal: controller.signal }, this.settings)
      .then(async response => {
        if (!response.ok || !response.body) {
          onEnd(`the log is not available (${response.status})`);
          return;
        }
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) {
            break;
          }
          onText(decoder.decode(value, { stream: true }));
        }
        onEnd();
      })
      .catch(err => {
        if (!controller.signal.aborted) {
          onEnd(String(err));
        }
      });
    return () => controller.abort();
  }

  /** The event stream; `onEvent` for each event, `onState(true|false)` as it connects or drops
   * (`closed`: the browser gave up on it, e.g. a refusal, and will not try again). */
  events(
    onEvent: (event: GpuEvent) => void,
    onState: (connected: boolean, closed: boolean) => void
  ): EventSource {
    const query = streamQuery(this.settings.token, document.cookie);
    const source = new EventSource(this.url(`${ROOT}/events`, query), { withCredentials: true });
    source.onopen = () => onState(true, false);
    source.onerror = () => onState(false, source.readyState === EventSource.CLOSED);
    source.onmessage = message => {
      try {
        onEvent(JSON.parse(message.data));
      } catch {
        // a message that is not JSON is not an event
      }
    };
    return source;
  }
}
