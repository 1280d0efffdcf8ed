import React, { useEffect, useRef, useState } from 'react';

import { GpuApi } from '../api';
import { formatDuration } from '../model/countdown';
import {
  ACTIVE_JOB_STATES,
  executedCopy,
  FINISHED_JOB_STATES,
  jobSliceText,
  rerunText,
  sortedJobs
} from '../model/jobs';
import { Job } from '../model/types';
import { Action, useNow } from './common';

export interface IJobActions {
  cancel(job: Job): void;
  rerun(job: Job): void;
  /** Open the executed notebook (a visible copy at `copy`). */
  openExecuted(job: Job, copy: string): void;
}

/** A job's log, streamed while it is shown. */
function JobLog(props: { api: GpuApi; id: string }): JSX.Element {
  const [text, setText] = useState('');
  const [end, setEnd] = useState<string | null>(null);
  const pre = useRef<HTMLPreElement>(null);
  useEffect(() => {
    setText('');
    return props.api.followLog(
      props.id,
      piece => setText(previous => previous + piece),
      error => setEnd(error ?? 'end of log')
    );
  }, [props.id]);
  useEffect(() => {
    if (pre.current) {
      pre.current.scrollTop = pre.current.scrollHeight;
    }
  }, [text]);
  return (
    <div>
      <pre ref={pre} className="jp-gpualloc-log" tabIndex={0} aria-label={`log of job ${props.id}`}>
        {text}
      </pre>
      {end && <div className="jp-gpualloc-muted">{end}</div>}
    </div>
  );
}

export function JobItem(props: { job: Job; api: GpuApi; actions: IJobActions; now: number }): JSX.Element {
  const { job, actions } = props;
  const [showLog, setShowLog] = useState(false);
  const executed = executedCopy(job, props.api.serverRoot);
  const name = job.name || job.id;
  const slice = jobSliceText(job);
  return (
    <li className="jp-gpualloc-job" data-job={job.id} data-state={job.state}>
      <div className="jp-gpualloc-slice-title">
        <strong>{name}</strong> <span className={`jp-gpualloc-badge jp-mod-${job.state}`}>{job.state}</span>
      </div>
      <div className="jp-gpualloc-muted">
        {job.state === 'queued' && job.position !== null && job.position !== undefined
          ? `${job.position === 0 ? 'starting' : `position ${job.position}`} · `
          : ''}
        {slice ? <span className="jp-gpualloc-job-slice">{slice}</span> : null}
        {slice ? ' · ' : ''}
        runtime {formatDuration(job.started_at, job.state === 'running' ? null : job.ended_at, props.now)}
        {job.reason ? <span className="jp-gpualloc-reason">{` · ${job.reason}`}</span> : ''}
      </div>
      <div className="jp-gpualloc-actions">
        <Action label={`${showLog ? 'Hide' : 'Show'} the log of ${name}`} onClick={() => setShowLog(!showLog)}>
          {showLog ? 'Hide log' : 'Logs'}
        </Action>
        {ACTIVE_JOB_STATES.has(job.state) && (
          <Action label={`Cancel ${name}`} onClick={() => actions.cancel(job)}>
            Cancel
          </Action>
        )}
        {FINISHED_JOB_STATES.has(job.state) && (
          <Action label={`Rerun ${name}`} onClick={() => actions.rerun(job)}>
            Rerun
          </Action>
        )}
        {executed && job.attempts !== 0 && FINISHED_JOB_STATES.has(job.state) && (
          <Action label={`Open the executed notebook of ${name}`} onClick={() => actions.openExecuted(job, executed)}>
            Open executed
          </Action>
        )}
      </div>
      {showLog && <JobLog api={props.api} id={job.id} />}
    </li>
  );
}

/** A cell's job and, once it was rerun (from the cell or elsewhere), that it was resubmitted and the newest
 * rerun as it is now. */
export function JobOutputView(props: {
  job: Job;
  rerun: Job | null;
  api: GpuApi;
  actions: IJobActions;
  now: number;
}): JSX.Element {
  const { job, rerun } = props;
  return (
    <ul className="jp-gpualloc-list">
      <JobItem job={job} api={props.api} actions={props.actions} now={props.now} />
      {rerun && (
        <li className="jp-gpualloc-rerun" data-rerun={rerun.id}>
          {rerunText(rerun)}
        </li>
      )}
      {rerun && <JobItem job={rerun} api={props.api} actions={props.actions} now={props.now} />}
    </ul>
  );
}

export function Jobs(props: { jobs: Job[] | null; api: GpuApi; actions: IJobActions }): JSX.Element {
  const now = useNow();
  if (props.jobs === null) {
    return <p className="jp-gpualloc-muted">The GPU allocator here runs no jobs.</p>;
  }
  if (props.jobs.length === 0) {
    return (
      <p className="jp-gpualloc-muted">
        No jobs. Right-click a notebook in the file browser and choose “Run as GPU job”.
      </p>
    );
  }
  const active = props.jobs.some(job => ACTIVE_JOB_STATES.has(job.state));
  return (
    <div>
      {active && (
        <p className="jp-gpualloc-note">Jobs run in this Jupyter server: stopping the server stops them.</p>
      )}
      <ul className="jp-gpualloc-list">
        {sortedJobs(props.jobs).map(job => (
          <JobItem key={job.id} job={job} api={props.api} actions={props.actions} now={now} />
        ))}
      </ul>
    </div>
  );
}
