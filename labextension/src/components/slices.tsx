import React from 'react';

import { IdleWarning } from '../model/events';
import { capInForce, gib, holderName, isolation, sliceName } from '../model/format';
import { LeaseEntry } from '../model/types';
import { Action, Countdown } from './common';

export interface ISliceActions {
  release(lease: LeaseEntry): void;
  extend(lease: LeaseEntry): void;
  openNotebook(kernelId: string): void;
  restartKernel(lease: LeaseEntry, kernelId: string): void;
  /** The notebook path of a kernel of this server, when one is open. */
  notebookOf(kernelId: string): string | null;
}

function Memory(props: { lease: LeaseEntry }): JSX.Element | null {
  const slice = props.lease.slice;
  if (!slice) {
    return null;
  }
  const used = props.lease.used_mib;
  return used !== null && used !== undefined ? (
    <span>
      {gib(used)} / {gib(slice.memory_mib)} GiB used
    </span>
  ) : (
    <span>{gib(slice.memory_mib)} GiB (usage not measured)</span>
  );
}

function SliceItem(props: { lease: LeaseEntry; warning?: IdleWarning; note?: string; actions: ISliceActions }) {
  const { lease, warning, note, actions } = props;
  const kernelId = lease.kernel?.id ?? (lease.holder.startsWith('kernel:') ? lease.holder.slice(7) : null);
  const notebook = kernelId ? actions.notebookOf(kernelId) : null;
  const where = notebook ?? holderName(lease.holder);
  if (lease.state === 'queued') {
    return (
      <li className="jp-gpualloc-slice" data-lease={lease.id} data-state="queued">
        <div className="jp-gpualloc-slice-title">
          <strong>{(lease.spec.profile as string) ?? lease.spec.kind ?? 'GPU'}</strong> for {where}
        </div>
        <div>
          waiting: position {lease.position ?? '?'} in the queue
          {lease.reason ? ` (${lease.reason})` : ''}
        </div>
        <div className="jp-gpualloc-actions">
          <Action label={`Cancel the request for ${where}`} onClick={() => actions.release(lease)}>
            Cancel
          </Action>
        </div>
      </li>
    );
  }
  return (
    <li className="jp-gpualloc-slice" data-lease={lease.id} data-state={lease.state}>
      <div className="jp-gpualloc-slice-title">
        <strong>{lease.slice ? sliceName(lease.slice) : lease.state}</strong> for {where}
      </div>
      <div className="jp-gpualloc-muted">
        isolation: {isolation(lease)} · cap: {capInForce(lease)}
      </div>
      <div>
        <Memory lease={lease} />
      </div>
      {warning && warning.releaseAt !== null && <Countdown releaseAt={warning.releaseAt} />}
      {note && <div className="jp-gpualloc-note">{note}</div>}
      <div className="jp-gpualloc-actions">
        <Action label={`Release the slice of ${where}`} onClick={() => actions.release(lease)}>
          Release
        </Action>
        <Action label={`Extend the slice of ${where}`} warn={!!warning} onClick={() => actions.extend(lease)}>
          Extend
        </Action>
        {kernelId && notebook && (
          <Action label={`Open ${notebook}`} onClick={() => actions.openNotebook(kernelId)}>
            Open notebook
          </Action>
        )}
        {kernelId && notebook && note && (
          <Action label={`Restart the kernel of ${notebook}`} onClick={() => actions.restartKernel(lease, kernelId)}>
            Restart kernel
          </Action>
        )}
      </div>
    </li>
  );
}

export function MySlices(props: {
  slices: LeaseEntry[];
  warnings: Record<string, IdleWarning>;
  notes: Record<string, string>;
  actions: ISliceActions;
}): JSX.Element {
  const mine = props.slices.filter(l => !l.holder.startsWith('job:'));
  if (mine.length === 0) {
    return <p className="jp-gpualloc-muted">No GPU slices.</p>;
  }
  return (
    <ul className="jp-gpualloc-list">
      {mine.map(lease => (
        <SliceItem
          key={lease.id}
          lease={lease}
          warning={props.warnings[lease.id]}
          note={props.notes[lease.id] ?? lease.note}
          actions={props.actions}
        />
      ))}
    </ul>
  );
}
