/** What the sidebar's Request button does for the current notebook, and what it asks first. */

import { kernelOfHolder, Question } from './format';
import { LeaseEntry, Offer } from './types';

/** What the offers sheet says of kernels here. */
export interface KernelRules {
  /** Each kind of holder ('kernel', 'job') that gets no slice here, with why (Kubernetes). */
  refusedHolders: Record<string, string>;
  /** GPU kernels run in pods of their own (Kubernetes): a running kernel gets a slice only by restarting into one. */
  kernelPods: boolean;
}

/** Ask for a slice for the notebook's running kernel, restart that kernel as a GPU kernel, or nothing,
 * with why. Every action names a kernel: the button never asks for a slice for the server itself. */
export type RequestAction =
  | { kind: 'request' | 'restart'; notebookPath: string; kernelId: string }
  | { kind: 'none'; why: string };

export function requestAction(
  notebookPath: string | null,
  kernelId: string | null,
  held: boolean,
  rules: KernelRules
): RequestAction {
  const why = (text: string): RequestAction => ({ kind: 'none', why: text });
  if (!rules.kernelPods && rules.refusedHolders.kernel) {
    return why(rules.refusedHolders.kernel);
  }
  if (notebookPath === null) {
    return why(
      rules.kernelPods
        ? 'Open a notebook to restart its kernel as a GPU kernel.'
        : 'Open a notebook to request a slice for its kernel.'
    );
  }
  if (!kernelId) {
    return why(`${notebookPath} has no running kernel.`);
  }
  if (held) {
    return why(`The kernel of ${notebookPath} already has a slice or a request.`);
  }
  return { kind: rules.kernelPods ? 'restart' : 'request', notebookPath, kernelId };
}

/** The Request button's text. */
export function requestButtonText(rules: KernelRules): string {
  return rules.kernelPods ? 'Restart as a GPU kernel…' : 'Request for this notebook';
}

/** The Request button's name for screen readers and its tooltip. */
export function requestButtonLabel(rules: KernelRules, notebookPath: string | null, offer: Offer): string {
  if (rules.kernelPods) {
    return notebookPath ? `Restart ${notebookPath} as a GPU kernel with ${offer.label}` : 'Restart as a GPU kernel';
  }
  return notebookPath ? `Request ${offer.label} for ${notebookPath}` : 'Request a slice';
}

/** The question asked before restarting a notebook's kernel as a GPU kernel. */
export function restartQuestion(notebookPath: string, offer: Offer): Question {
  const wait =
    offer.available > 0
      ? `It may still wait in the queue for the ${offer.label} slice.`
      : `No ${offer.label} slice is free now: it waits in the queue for one.`;
  return {
    title: `Restart ${notebookPath} as a GPU kernel?`,
    body:
      'A GPU kernel on Kubernetes runs in a pod of its own, so the kernel of this notebook restarts: ' +
      `its variables are lost and its cells need to run again. ${wait}`,
    accept: `Restart with ${offer.label}`
  };
}

/** A restart as a GPU kernel asked for here: the server's note, and whether the kernel's lease was listed since. */
export interface PendingRestart {
  note: string;
  leaseSeen: boolean;
}

/** The note of a pending restart as a GPU kernel, for the lease of that kernel. */
export function restartNoteOf(restarts: Record<string, PendingRestart>, lease: LeaseEntry): string | undefined {
  const kernelId = kernelOfHolder(lease.holder);
  return kernelId === null ? undefined : restarts[kernelId]?.note;
}

/** The restarts still pending (by kernel id) after a fresh list of my slices: one is over once its
 * kernel's slice is granted, or once its listed request is gone (withdrawn, refused). */
export function settleRestarts(
  restarts: Record<string, PendingRestart>,
  slices: LeaseEntry[]
): Record<string, PendingRestart> {
  const pending: Record<string, PendingRestart> = {};
  for (const [kernelId, restart] of Object.entries(restarts)) {
    const lease = slices.find(l => kernelOfHolder(l.holder) === kernelId);
    if (lease?.state === 'granted' || (!lease && restart.leaseSeen)) {
      continue;
    }
    pending[kernelId] = { ...restart, leaseSeen: restart.leaseSeen || lease !== undefined };
  }
  return pending;
}

/** The notes a request was answered with (by lease id), after a fresh list of my slices: the list's own
 * note replaces each ("the kernel uses the slice from its next cell"), and one the list no longer gives
 * is over (the kernel applied the slice, or the lease ended). */
export function settleNotes(notes: Record<string, string>, slices: LeaseEntry[]): Record<string, string> {
  const left: Record<string, string> = {};
  for (const leaseId of Object.keys(notes)) {
    const note = slices.find(l => l.id === leaseId)?.note;
    if (note) {
      left[leaseId] = note;
    }
  }
  return left;
}

/** What the request list says of an offer now: refused by a quota (greyed out, `why` in full), waiting
 * behind the caller's own slices in use (`quota-full`), or how many are free. */
export interface OfferAvailability {
  state: 'free' | 'wait' | 'quota-full' | 'refused';
  text: string;
  why: string | null;
}

export function offerAvailability(offer: Offer): OfferAvailability {
  if (offer.over_quota) {
    return { state: 'refused', text: 'over your quota', why: offer.over_quota };
  }
  if (offer.over_usage_quota) {
    return { state: 'refused', text: 'usage quota used up', why: offer.over_usage_quota };
  }
  if (offer.quota_full) {
    return { state: 'quota-full', text: `your quota is full now: ${offer.quota_full}`, why: offer.quota_full };
  }
  if (offer.available > 0) {
    return { state: 'free', text: `${offer.available} free now`, why: null };
  }
  return { state: 'wait', text: 'none free: you would wait', why: null };
}
