import React from 'react';

import { deadlineView } from '../model/deadline';
import { jobOf } from '../model/holders';
import { EndedSlice, endedSummary, IdleWarning } from '../model/events';
import { gib, holderName, kernelOfHolder, protection, requestName, sliceName } from '../model/format';
import { PendingRestart, restartNoteOf } from '../model/request';
import { Deadline, LeaseEntry } from '../model/types';
import { Sparkline } from './charts';
import { Action, Countdown, IdleRelease, useNow } from './common';

export interface ISliceActions {
  release(lease: LeaseEntry): void;
  /** Clear an idle warning: the slice counts as used now. */
  keep(lease: LeaseEntry): void;
  /** Move a time-boxed slice's deadline later. */
  extendDeadline(lease: LeaseEntry): void;
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

/** "time limit: 3:59:12 left · 1 extension left", marked once the allocator warned of it. */
function TimeLimit(props: { deadline: Deadline; warned: boolean }): JSX.Element {
  const view = deadlineView(props.deadline, useNow(), props.warned);
  return (
    <div
      className={`jp-gpualloc-deadline${view.warned ? ' jp-mod-warn' : ''}`}
      data-warned={view.warned}
      data-extensions-left={view.extensionsLeft}
    >
      <span role="timer" aria-live="off">
        {view.text}
      </span>{' '}
      · {view.extensionsText}
    </div>
  );
}

/** Where a holder runs, for people: its notebook when open here, else "kernel 1a2b3c4d", "this server". */
function whereOf(holder: string, actions: ISliceActions): string {
  const kernelId = kernelOfHolder(holder);
  return (kernelId ? actions.notebookOf(kernelId) : null) ?? holderName(holder);
}

export function SliceItem(props: {
  lease: LeaseEntry;
  warning?: IdleWarning;
  deadlineWarned: boolean;
  note?: string;
  /** The server's note on the kernel's restart as a GPU kernel, while it waits for its slice. */
  restartNote?: string;
  actions: ISliceActions;
}) {
  const { lease, warning, note, actions } = props;
  const kernelId = lease.kernel?.id ?? kernelOfHolder(lease.holder);
  const notebook = kernelId ? actions.notebookOf(kernelId) : null;
  const where = notebook ?? holderName(lease.holder);
  const deadline = lease.deadline ?? null;
  if (lease.state === 'queued') {
    return (
      <li className="jp-gpualloc-slice" data-lease={lease.id} data-state="queued">
        <div className="jp-gpualloc-slice-title">
          <strong>{requestName(lease.spec)}</strong> for {where}
        </div>
        <div>
          waiting: position {lease.position ?? '?'} in the queue
          {lease.reason ? ` (${lease.reason})` : ''}
        </div>
        {props.restartNote && <div className="jp-gpualloc-note">{props.restartNote}</div>}
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
        isolation: {protection(lease)}
      </div>
      <div>
        <Memory lease={lease} />
      </div>
      <Sparkline utilization={lease.utilization} />
      {deadline && <TimeLimit deadline={deadline} warned={props.deadlineWarned} />}
      {warning && warning.releaseAt !== null ? <Countdown releaseAt={warning.releaseAt} /> : <IdleRelease lease={lease} />}
      {note && <div className="jp-gpualloc-note">{note}</div>}
      <div className="jp-gpualloc-actions">
        <Action label={`Release the slice of ${where}`} onClick={() => actions.release(lease)}>
          Release
        </Action>
        {warning && (
          <Action label={`Keep the slice of ${where}: it is in use`} warn onClick={() => actions.keep(lease)}>
            Keep active
          </Action>
        )}
        {deadline && deadline.extensions_left > 0 && (
          <Action
            label={`Extend the time limit of ${where}`}
            warn={props.deadlineWarned || deadline.warned_at !== null}
            onClick={() => actions.extendDeadline(lease)}
          >
            Extend
          </Action>
        )}
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

/** The slices of mine that ended lately: each once, with the slice, when it was held and for how long, and
 * why it ended (time limit, idle, usage quota, preemption). */
function Ended(props: { ended: EndedSlice[]; actions: ISliceActions }): JSX.Element | null {
  if (props.ended.length === 0) {
    return null;
  }
  return (
    <ul className="jp-gpualloc-ended" aria-label="slices ended lately">
      {props.ended.map(e => (
        <li key={e.leaseId} data-lease={e.leaseId}>
          {whereOf(e.holder, props.actions)}: {endedSummary(e)}
        </li>
      ))}
    </ul>
  );
}

export function MySlices(props: {
  slices: LeaseEntry[];
  warnings: Record<string, IdleWarning>;
  deadlineWarnings: Record<string, number | null>;
  ended: EndedSlice[];
  notes: Record<string, string>;
  /** Restarts as GPU kernels asked for here, by kernel id. */
  restarts: Record<string, PendingRestart>;
  actions: ISliceActions;
}): JSX.Element {
  const mine = props.slices.filter(l => jobOf(l.holder) === null);
  const listed = new Set(mine.map(l => kernelOfHolder(l.holder)));
  const unlisted = Object.entries(props.restarts).filter(([kernelId]) => !listed.has(kernelId));
  return (
    <>
      {mine.length === 0 && unlisted.length === 0 ? (
        <p className="jp-gpualloc-muted">No GPU slices.</p>
      ) : (
        <ul className="jp-gpualloc-list">
          {mine.map(lease => (
            <SliceItem
              key={lease.id}
              lease={lease}
              warning={props.warnings[lease.id]}
              deadlineWarned={lease.id in props.deadlineWarnings}
              note={props.notes[lease.id] ?? lease.note}
              restartNote={restartNoteOf(props.restarts, lease)}
              actions={props.actions}
            />
          ))}
          {unlisted.map(([kernelId, restart]) => (
            <li key={kernelId} className="jp-gpualloc-slice" data-restart={kernelId} data-state="restarting">
              <div className="jp-gpualloc-slice-title">
                <strong>{whereOf(`kernel:${kernelId}`, props.actions)}</strong>: restarting as a GPU kernel
              </div>
              <div className="jp-gpualloc-note">{restart.note}</div>
            </li>
          ))}
        </ul>
      )}
      <Ended ended={props.ended} actions={props.actions} />
    </>
  );
}
