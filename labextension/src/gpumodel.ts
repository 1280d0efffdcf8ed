/**
 * The panel's and the status bar's shared state: fetched from the server extension, kept live by
 * its event stream (polling only while the stream is down, and for the memory a held slice uses,
 * which no event carries), and turned into notifications.
 */

import { Notification } from '@jupyterlab/apputils';
import { ISignal, Signal } from '@lumino/signaling';

import { GpuApi } from './api';
import { extensionRefusal } from './model/deadline';
import { ApiError, plainError, ServerStopped, unreachableText } from './model/errors';
import { namedAfterJob, namedAfterNotebook, Question, ServerPhase } from './model/format';
import { ACTIVE_JOB_STATES } from './model/jobs';
import { INITIAL_STATE, Notice, reduce, StreamState, withSlices } from './model/events';
import { KernelRules, PendingRestart, restartQuestion, settleNotes, settleRestarts } from './model/request';
import { recheckDelay, reconnectDelay } from './model/stream';
import { GpuEvent, Inventory, Job, KernelRestart, LeaseEntry, Offer, Reservation, UsageReport } from './model/types';

/** Seconds between fetches while the event stream is down or a slice is held, and while a job of mine is active. */
export const POLL_SECONDS = 10;
export const JOB_POLL_SECONDS = 3;
/** Seconds between checks of a server whose GPU features are off. */
export const OFF_RECHECK_SECONDS = 60;
const FINISHED_JOB: Record<string, 'success' | 'error'> = {
  succeeded: 'success',
  failed: 'error',
  timed_out: 'error'
};

export class GpuModel {
  /** `notebookOf(kernelId)`: the path of the open notebook a kernel runs, to name it in notifications. */
  constructor(
    readonly api: GpuApi,
    private notebookOf: (kernelId: string) => string | null = () => null
  ) {}

  inventory: Inventory | null = null;
  offers: Offer[] = [];
  /** Each kind of holder ('kernel', 'job') that gets no slice here, with why (Kubernetes). */
  refusedHolders: Record<string, string> = {};
  /** GPU kernels run in pods of their own (Kubernetes): a running kernel gets a slice by restarting into one. */
  kernelPods = false;
  /** The reservations I may use that have not ended (empty when the allocator has none). */
  reservations: Reservation[] = [];
  /** My GPU-hours and usage quotas; null until fetched, or when the allocator gives none. */
  usage: UsageReport | null = null;
  stream: StreamState = INITIAL_STATE;
  /** null: the allocator has no jobs API. */
  jobs: Job[] | null = [];
  connected = false;
  /** Where this tab stands with its server: nothing else is fetched while GPU features are off there
   * (`offReason` says why) or while it has stopped; it is asked again now and then, or on `recheck()`. */
  phase: ServerPhase = 'loading';
  offReason: string | null = null;
  /** Why the last fetch failed (cleared by the next that works). */
  unreachable: string | null = null;
  /** Why the last action (request, release, job...) was refused, in plain words (cleared by the next that works). */
  error: string | null = null;
  /** What the server said to do after a request, per lease ("restart the kernel to use the slice"). */
  notes: Record<string, string> = {};
  /** The restarts as GPU kernels asked for here and not over (by kernel id), with the server's note. */
  restarts: Record<string, PendingRestart> = {};

  /** Nothing is fetched: GPU features are off on the server, or it has stopped. */
  get paused(): boolean {
    return this.phase === 'off' || this.phase === 'stopped';
  }

  get slices(): LeaseEntry[] {
    return this.stream.slices;
  }

  get kernelRules(): KernelRules {
    return { refusedHolders: this.refusedHolders, kernelPods: this.kernelPods };
  }

  get changed(): ISignal<GpuModel, void> {
    return this._changed;
  }

  /** Ask the server whether GPU features are on; then fetch everything and open the event stream. */
  start(): void {
    void this.recheck();
  }

  /** Ask the server again now (a person's click, or the next scheduled check while off or stopped). */
  async recheck(): Promise<void> {
    window.clearTimeout(this._recheck);
    let status;
    try {
      status = await this.api.status();
    } catch (err) {
      if (!(err instanceof ServerStopped)) {
        status = null; // the other calls say what is wrong
      } else {
        this.stopped(err);
        return;
      }
    }
    if (status?.mode === 'off') {
      this.pause('off');
      this.offReason = status.reason || 'GPU slices and jobs are off on this server';
      this._changed.emit();
      this._recheck = window.setTimeout(() => void this.recheck(), OFF_RECHECK_SECONDS * 1000);
      return;
    }
    if (!this._live) {
      this.resume();
    }
  }

  /** Fetch everything, open the event stream and poll while it is down or a slice is held. */
  private resume(): void {
    this._live = true;
    this.phase = 'loading'; // until my slices are known
    this.offReason = null;
    this._stoppedChecks = 0;
    this.unreachable = null;
    void this.refresh();
    void this.refreshJobs();
    this.connect();
    window.clearInterval(this._poll);
    this._poll = window.setInterval(() => {
      // no event says how much memory a slice's processes use: re-read while one is held
      if (!this.connected || this.slices.some(l => l.state === 'granted')) {
        void this.refresh();
      }
    }, POLL_SECONDS * 1000);
  }

  /** Stop polling and close the event stream: GPU features are off, or the server has stopped. */
  private pause(phase: 'off' | 'stopped'): void {
    this._live = false;
    this.phase = phase;
    this._source?.close();
    this._source = null;
    this.connected = false;
    window.clearTimeout(this._reconnect);
    window.clearInterval(this._poll);
    window.clearTimeout(this._jobPoll);
  }

  /** The server answers no more: nothing it held is shown as held, and it is asked again less and less often. */
  private stopped(err: ServerStopped): void {
    if (this.phase !== 'stopped') {
      this.pause('stopped');
      this.stream = withSlices(this.stream, []);
      this.dismissClearedWarnings();
    }
    this.unreachable = unreachableText(err);
    this._changed.emit();
    window.clearTimeout(this._recheck);
    this._recheck = window.setTimeout(() => void this.recheck(), recheckDelay(this._stoppedChecks++));
  }

  dispose(): void {
    this.pause('stopped');
    window.clearTimeout(this._recheck);
  }

  /** Close the warning notifications of slices no longer warned (kept, extended, ended). */
  private dismissClearedWarnings(): void {
    for (const [toasts, inForce] of [
      [this._warningToasts, this.stream.warnings],
      [this._deadlineToasts, this.stream.deadlineWarnings]
    ] as const) {
      for (const [leaseId, toast] of Object.entries(toasts)) {
        if (!(leaseId in inForce)) {
          Notification.dismiss(toast);
          delete toasts[leaseId];
        }
      }
    }
  }

  /** Fetch the fleet, offers and my slices, my usage and my reservations; each is shown as soon as it arrives. */
  async refresh(): Promise<void> {
    if (this.paused) {
      return;
    }
    await Promise.all([this.refreshLeases(), this.refreshUsage(), this.refreshReservations()]);
  }

  private async refreshReservations(): Promise<void> {
    try {
      this.reservations = (await this.api.reservations()).filter(r => r.state !== 'ended');
    } catch {
      this.reservations = [];
    }
    this._changed.emit();
  }

  private async refreshUsage(): Promise<void> {
    try {
      this.usage = await this.api.usage();
    } catch {
      this.usage = null;
    }
    this._changed.emit();
  }

  private async refreshLeases(): Promise<void> {
    try {
      const [inventory, sheet, slices] = await Promise.all([
        this.api.inventory(),
        this.api.offers(),
        this.api.slices()
      ]);
      this.inventory = inventory;
      this.offers = sheet.offers;
      this.refusedHolders = sheet.refused_holders;
      this.kernelPods = sheet.kernel_pods === true;
      this.stream = withSlices(this.stream, slices);
      this.restarts = settleRestarts(this.restarts, this.slices);
      this.notes = settleNotes(this.notes, slices);
      this.dismissClearedWarnings();
      this.unreachable = null;
    } catch (err) {
      if (err instanceof ServerStopped) {
        this.stopped(err);
        return;
      }
      this.unreachable = unreachableText(err);
    }
    if (!this.paused) {
      this.phase = 'on'; // the server answered: what the status bar says of my slices is known
    }
    this._changed.emit();
  }

  async refreshJobs(): Promise<void> {
    window.clearTimeout(this._jobPoll);
    if (this.paused) {
      return;
    }
    let jobs: Job[];
    try {
      jobs = await this.api.jobs();
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        this.jobs = null;
        this._changed.emit();
      }
      return;
    }
    this.announceFinishedJobs(jobs);
    this.jobs = jobs;
    this._changed.emit();
    if (jobs.some(j => ACTIVE_JOB_STATES.has(j.state))) {
      this._jobPoll = window.setTimeout(() => void this.refreshJobs(), JOB_POLL_SECONDS * 1000);
    }
  }

  /** Notify about jobs that were active at the last fetch and have finished since. */
  private announceFinishedJobs(jobs: Job[]): void {
    const before = new Map((this.jobs ?? []).map(j => [j.id, j.state]));
    for (const job of jobs) {
      const was = before.get(job.id);
      const type = FINISHED_JOB[job.state];
      if (was && ACTIVE_JOB_STATES.has(was) && type && !this._announcedJobs.has(job.id)) {
        this._announcedJobs.add(job.id);
        Notification.emit(`GPU job ${job.name || job.id} ${job.state.replace('_', ' ')}.`, type, {
          autoClose: 8000
        });
      }
    }
  }

  /** Apply an event: new state at once, a notification, then a fresh fetch of what it touched. */
  handle(event: GpuEvent): void {
    const reduction = reduce(this.stream, event);
    this.stream = reduction.state;
    this.restarts = settleRestarts(this.restarts, this.slices);
    this.dismissClearedWarnings();
    this._changed.emit();
    if (reduction.notice) {
      this.notify(reduction.notice, event);
    }
    if (reduction.refreshLeases) {
      void this.refresh();
    }
    if (reduction.refreshJobs) {
      void this.refreshJobs();
    }
  }

  private notify(notice: Notice, event: GpuEvent): void {
    if (notice.kind === 'job-succeeded' || notice.kind === 'job-failed') {
      if (event.job_id) {
        this._announcedJobs.add(event.job_id);
      }
    }
    const leaseId = notice.leaseId;
    const kernelId = event.kernel_id;
    const notebook = kernelId ? this.notebookOf(kernelId) : null;
    const job = (this.jobs ?? []).find(j => `job:${j.id}` === event.holder);
    const text = namedAfterJob(
      kernelId && notebook ? namedAfterNotebook(notice.message, kernelId, notebook) : notice.message,
      event.holder,
      job?.name
    );
    const toasts = { 'idle-warning': this._warningToasts, 'deadline-warning': this._deadlineToasts }[
      notice.kind as string
    ];
    const toast = Notification.emit(text, notice.type, {
      autoClose: toasts ? false : 8000,
      actions: leaseId ? this.noticeActions(notice.kind, leaseId) : []
    });
    if (toasts !== undefined && leaseId) {
      if (toasts[leaseId]) {
        Notification.dismiss(toasts[leaseId]);
      }
      toasts[leaseId] = toast;
    }
  }

  /** Keep active on an idle warning; Extend on a deadline warning while the slice has extensions left. */
  private noticeActions(kind: Notice['kind'], leaseId: string): Notification.IAction[] {
    if (kind === 'idle-warning') {
      return [
        { label: 'Keep active', caption: 'I am still using this GPU slice', callback: () => void this.keep(leaseId) }
      ];
    }
    const deadline = this.slices.find(l => l.id === leaseId)?.deadline;
    if (kind === 'deadline-warning' && deadline && deadline.extensions_left > 0) {
      return [
        {
          label: 'Extend',
          caption: 'Move the time limit of this GPU slice later',
          callback: () => void this.extendDeadline(leaseId)
        }
      ];
    }
    return [];
  }

  /** Run a call; a refusal becomes `error` in plain words. Returns the call's value or null. */
  async act<T>(call: () => Promise<T>): Promise<T | null> {
    try {
      const value = await call();
      this.error = null;
      return value;
    } catch (err) {
      this.error = plainError(err);
      this._changed.emit();
      return null;
    } finally {
      void this.refresh();
    }
  }

  /** Ask for a slice for a kernel; what the server says to do next (restart the kernel) is kept in `notes`. */
  async request(offer: string, kernelId: string): Promise<LeaseEntry | null> {
    const lease = await this.act(() => this.api.request(offer, kernelId));
    if (lease?.note) {
      this.notes = { ...this.notes, [lease.id]: lease.note };
      this._changed.emit();
    }
    return lease;
  }

  /**
   * Restart a notebook's kernel as a GPU kernel with an offer's slice (kernel pods), once `confirm`
   * says yes to the question: the server restarts it into a pod of its own, where it may wait in the
   * queue first. The server's note is kept in `restarts` until the kernel's slice is granted or its
   * request ends.
   */
  async restartAsGpuKernel(
    offer: Offer,
    notebookPath: string,
    kernelId: string,
    confirm: (question: Question) => Promise<boolean>
  ): Promise<KernelRestart | null> {
    if (!(await confirm(restartQuestion(notebookPath, offer)))) {
      return null;
    }
    const restart = await this.act(() => this.api.restartAsGpuKernel(offer.name, kernelId));
    if (restart?.note) {
      this.restarts = { ...this.restarts, [kernelId]: { note: restart.note, leaseSeen: false } };
      this._changed.emit();
    }
    return restart;
  }

  /** Forget a lease's note (e.g. once its kernel was restarted). */
  clearNote(leaseId: string): void {
    const { [leaseId]: _done, ...rest } = this.notes;
    this.notes = rest;
    this._changed.emit();
  }

  release(leaseId: string): Promise<LeaseEntry | null> {
    return this.act(() => this.api.release(leaseId));
  }

  /** Keep an idle-warned slice (counts as activity now). */
  keep(leaseId: string): Promise<LeaseEntry | null> {
    return this.act(() => this.api.keep(leaseId));
  }

  /** Move a time-boxed slice's deadline later; a refusal is a notification in plain words. */
  async extendDeadline(leaseId: string): Promise<LeaseEntry | null> {
    try {
      return await this.api.extendDeadline(leaseId);
    } catch (err) {
      Notification.emit(extensionRefusal(err), 'warning', { autoClose: 8000 });
      return null;
    } finally {
      void this.refresh();
    }
  }

  async jobAction<T>(call: () => Promise<T>): Promise<T | null> {
    const value = await this.act(call);
    await this.refreshJobs();
    return value;
  }

  private connect(): void {
    if (!this._live) {
      return;
    }
    this._source = this.api.events(
      event => this.handle(event),
      (connected, closed) => {
        const reconnected = connected && !this.connected;
        this._streamFailures = connected ? 0 : this._streamFailures + 1;
        if (this.connected !== connected) {
          this.connected = connected;
          this._changed.emit();
        }
        if (reconnected) {
          void this.refresh();
        }
        if (!connected && this._live) {
          void this.recheck(); // has the server stopped?
        }
        if (closed) {
          this._source?.close();
          this._source = null;
          this._reconnect = window.setTimeout(() => this.connect(), reconnectDelay(this._streamFailures));
        }
      }
    );
  }

  private _changed = new Signal<GpuModel, void>(this);
  private _source: EventSource | null = null;
  private _streamFailures = 0;
  private _reconnect = 0;
  private _poll = 0;
  private _jobPoll = 0;
  private _recheck = 0;
  /** Fetching and listening (GPU features on, the server answering). */
  private _live = false;
  /** Checks of a stopped server so far: each waits longer. */
  private _stoppedChecks = 0;
  private _announcedJobs = new Set<string>();
  /** The notification of each slice's idle warning in force. */
  private _warningToasts: Record<string, string> = {};
  /** The notification of each slice's deadline warning in force. */
  private _deadlineToasts: Record<string, string> = {};
}
