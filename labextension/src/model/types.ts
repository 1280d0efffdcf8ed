/**
 * The payloads of the server extension's sidebar API (`<base_url>gpualloc/api/...`) and of
 * REST API v1 (`<base_url>gpualloc/api/v1/...`), as far as the sidebar reads them.
 */

export interface SliceInfo {
  kind: 'mig' | 'shared' | 'whole';
  node: string;
  gpu_uuids: string[];
  memory_mib: number;
  profile?: string;
  start?: number;
  mig_uuid?: string;
  milli?: number;
  model?: string;
  gpu_memory_mib?: number;
  visible_devices: string;
}

export type LeaseState =
  | 'queued'
  | 'granted'
  | 'released'
  | 'expired'
  | 'preempted'
  | 'rejected'
  | 'cancelled';

export interface KernelRef {
  id: string;
  name: string;
  execution_state: string;
}

/** A time-boxed lease's deadline (REST API v1's Lease.deadline): when, extensions used and left, when warned. */
export interface Deadline {
  at: number;
  extensions: number;
  extensions_left: number;
  warned_at: number | null;
}

/** REST API v1's Lease.idle_release (epoch seconds): warned at `warn_at`, released `grace` s later at `release_at`. */
export interface IdleRelease {
  since: number;
  warn_at: number;
  release_at: number;
  grace: number;
  warned: boolean;
}

/** A lease as /gpualloc/api/slices gives it: the v1 lease plus its kernel and the caps in force. */
export interface LeaseEntry {
  id: string;
  user: string;
  holder: string;
  spec: Record<string, unknown>;
  priority: 'interactive' | 'batch';
  state: LeaseState;
  slice: SliceInfo | null;
  created_at: number;
  granted_at?: number | null;
  last_activity?: number | null;
  idle_warned_at?: number | null;
  idle_timeout?: number | null;
  deadline?: Deadline | null;
  /** When idle release takes the slice back if its holder stays idle; null while the holder is busy
   * or without idle release (absent from services that predate it). */
  idle_release?: IdleRelease | null;
  reason: string;
  position: number | null;
  kernel?: KernelRef | null;
  caps?: string[];
  used_mib?: number | null;
  /** A granted slice's SM utilisation samples of the last minutes; null when the allocator does not say. */
  utilization?: RecentUtilization | null;
  note?: string;
}

export interface RecentUtilization {
  /** How many seconds back the samples go, and the allocator's time (epoch s) when it answered. */
  window: number;
  now: number;
  /** Oldest first; none where nothing samples the slice's GPU. */
  samples: { at: number; sm_percent: number }[];
}

export interface MigInstance {
  uuid?: string;
  profile: string;
  start: number;
  size: number;
  lease_id?: string | null;
  user?: string;
}

export interface Share {
  lease_id?: string | null;
  memory_mib: number;
  kind: string;
  user?: string;
}

export interface Gpu {
  uuid: string;
  index?: number;
  model: string;
  memory_mib: number;
  mig_mode: 'off' | 'static' | 'dynamic';
  drained: boolean;
  memory_slices?: number;
  instances?: MigInstance[];
  free_memory_slices?: number;
  shares?: Share[];
  free_memory_mib?: number;
  whole_free?: boolean;
}

export interface InventoryNode {
  name: string;
  gpus: Gpu[];
}

/** A node whose GPUs the backend cannot use (e.g. Kubernetes labels it cannot read), and why. */
export interface UnusableNode {
  name: string;
  reason: string;
}

export interface Inventory {
  nodes: InventoryNode[];
  queue: Record<string, number>;
  unusable_nodes?: UnusableNode[];
  user?: string;
  admin?: boolean;
}

export interface Offer {
  name: string;
  label: string;
  spec: Record<string, unknown>;
  idle_timeout?: number | null;
  available: number;
  /** The usage quota that refuses a request now, as a sentence; null when none does. */
  over_usage_quota?: string | null;
  /** The quota that never allows this offer to the caller; null when none. */
  over_quota?: string | null;
  /** The quota the caller's slices in use fill now (a request waits until one ends); null when none. */
  quota_full?: string | null;
}

/** The offers payload: the offers, each kind of holder ('kernel', 'job') that gets no slice here, with why,
 * and whether GPU kernels run in pods of their own (Kubernetes; absent from servers that predate them). */
export interface OfferSheet {
  offers: Offer[];
  refused_holders: Record<string, string>;
  kernel_pods?: boolean;
}

/** The answer (202) to a request to restart a kernel as a GPU kernel: the server restarts it into a pod of its own. */
export interface KernelRestart {
  kernel_id: string;
  restarting: boolean;
  offer: string;
  /** One line for people on what happens now. */
  note: string;
}

/** A reservation the caller may use (REST API v1's Reservation), with its one-line summary. */
export interface Reservation {
  name: string;
  state: 'upcoming' | 'active' | 'ended';
  /** e.g. "ml101 reservation: 22 of 30 free until 12:00 UTC". */
  summary: string;
  count: number;
  in_use: number;
  next_start: number | null;
}

/** Where the caller stands against one usage quota (REST API v1's UsageQuota). */
export interface UsageQuota {
  scope: 'user' | 'group';
  who: string;
  gpu_hours: number;
  limit: number;
  window: string;
  resets_at: number | null;
  /** The used fraction from which the allocator warns this quota's leases (its policy's usage_warn_fraction). */
  warn_fraction: number;
  /** "you have used 12.50 of 40 GPU-hours this week (resets Mon 2026-12-07 00:00 UTC)" */
  message: string;
}

/** The caller's usage report (/gpualloc/api/usage): GPU-hours since the start of the month and the quotas. */
export interface UsageReport {
  since: number;
  until: number;
  total: { gpu_hours: number; gib_hours: number };
  quotas: UsageQuota[];
  /** My GPU-hours per UTC day of the last 14 days (days with use), split by offer ("" for no offer). */
  history?: UsageDay[];
}

export interface UsageDay {
  day: string;
  gpu_hours: number;
  offers: Record<string, number>;
}

export interface Job {
  id: string;
  name?: string;
  state: string;
  position?: number | null;
  created_at?: number | null;
  started_at?: number | null;
  ended_at?: number | null;
  reason?: string | null;
  lease_id?: string | null;
  /** What the job asked for, and the slice granted to it once it has one. */
  spec?: Record<string, unknown>;
  slice?: SliceInfo | null;
  workdir?: string;
  runtime_s?: number | null;
  attempts?: number;
  source?: { kind: string; path?: string; [key: string]: unknown };
  /** The job this one reruns. */
  rerun_of?: string | null;
  [key: string]: unknown;
}

/** The server extension's status (`/gpualloc/api/status`): `off` with the reason when GPU features are off here. */
export interface ServerStatus {
  mode: 'off' | 'embedded' | 'remote';
  reason?: string | null;
}

/** One message of the sidebar's event stream (`/gpualloc/api/events`). */
export interface GpuEvent {
  type: string;
  lease_id?: string;
  holder?: string;
  kernel_id?: string;
  state?: string;
  reason?: string;
  slice?: SliceInfo;
  message?: string;
  release_at?: number;
  /** lease.deadline_warning and lease.extended: the time limit (epoch s), extensions used and left. */
  deadline?: number;
  extensions?: number;
  extensions_left?: number;
  /** lease.queued: the place in the queue. */
  position?: number;
  job_id?: string;
  [key: string]: unknown;
}
