/**
 * The outputs `%%gpu job` and `%gpu status` leave in a notebook, rendered from the panel's model
 * (REST API v1) instead of from a widget model: a reopened notebook, or one whose kernel
 * restarted, still shows the job or the slice as it is now, never "Error displaying widget:
 * model not found". The kernel's bundles carry the ipywidget too, for other frontends.
 */

import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import React from 'react';

import { GpuModel } from '../gpumodel';
import { latestRerun } from '../model/jobs';
import { restartNoteOf } from '../model/request';
import { useNow } from './common';
import { IJobActions, JobOutputView } from './jobs';
import { ISliceActions, SliceItem } from './slices';

/** A job's output; its data is `{"job_id": "..."}` (kernel/job_widget.py). */
export const JOB_MIME = 'application/vnd.jupyter-gpualloc.job+json';
/** A lease's output; its data is `{"lease_id": "..."}` (kernel/widget.py). */
export const LEASE_MIME = 'application/vnd.jupyter-gpualloc.lease+json';
/** Ahead of ipywidgets' widget view (rank -10 in jupyterlab_widgets), which the bundles also carry. */
export const OUTPUT_RANK = -20;

function JobOutputBody(props: { model: GpuModel; actions: IJobActions; jobId: string; text: string }) {
  const now = useNow();
  const jobs = props.model.jobs ?? [];
  const job = jobs.find(j => j.id === props.jobId);
  if (!job) {
    return (
      <div className="jp-gpualloc-muted" data-job={props.jobId}>
        {props.text || `GPU job ${props.jobId}`} (not among your jobs now)
      </div>
    );
  }
  return (
    <JobOutputView
      job={job}
      rerun={latestRerun(jobs, job.id)}
      api={props.model.api}
      actions={props.actions}
      now={now}
    />
  );
}

function LeaseOutputBody(props: { model: GpuModel; actions: ISliceActions; leaseId: string; text: string }) {
  const { model, leaseId } = props;
  const lease = model.slices.find(l => l.id === leaseId);
  if (!lease) {
    const ended = model.stream.ended.find(e => e.leaseId === leaseId);
    return (
      <div className="jp-gpualloc-muted" data-lease={leaseId} data-state="ended">
        {props.text || `GPU lease ${leaseId}`} ({ended ? ended.text : 'this lease has ended'})
      </div>
    );
  }
  return (
    <>
      <ul className="jp-gpualloc-list">
        <SliceItem
          lease={lease}
          warning={model.stream.warnings[leaseId]}
          deadlineWarned={leaseId in model.stream.deadlineWarnings}
          note={model.notes[leaseId] ?? lease.note}
          restartNote={restartNoteOf(model.restarts, lease)}
          actions={props.actions}
        />
      </ul>
      {props.text && (
        <details className="jp-gpualloc-muted">
          <summary>%gpu status as it was printed (devices, caps, usage quotas)</summary>
          <pre>{props.text}</pre>
        </details>
      )}
    </>
  );
}

/** One output: the data's id under `mime`, drawn by `body` whenever the panel's model changes. */
class LiveOutput extends ReactWidget implements IRenderMime.IRenderer {
  private itemId = '';
  private text = '';

  constructor(
    private readonly model: GpuModel,
    private readonly mime: string,
    private readonly key: string,
    private readonly body: (id: string, text: string) => JSX.Element,
    private readonly fetchUnknown: (id: string) => void = () => undefined
  ) {
    super();
    this.addClass('jp-gpualloc-output');
  }

  async renderModel(mimeModel: IRenderMime.IMimeModel): Promise<void> {
    const data = mimeModel.data[this.mime] as Record<string, unknown> | undefined;
    this.itemId = String(data?.[this.key] ?? '');
    this.text = String(mimeModel.data['text/plain'] ?? '');
    this.fetchUnknown(this.itemId);
    this.update();
  }

  render(): JSX.Element {
    return <UseSignal signal={this.model.changed}>{() => this.body(this.itemId, this.text)}</UseSignal>;
  }
}

/** The renderer factories of job and lease outputs, sharing the panel's model (one poll for all). */
export function outputFactories(
  model: GpuModel,
  jobs: IJobActions,
  slices: ISliceActions
): IRenderMime.IRendererFactory[] {
  return [
    {
      safe: true,
      mimeTypes: [JOB_MIME],
      defaultRank: OUTPUT_RANK,
      createRenderer: () => {
        const output = new LiveOutput(
          model,
          JOB_MIME,
          'job_id',
          (id, text) => <JobOutputBody model={model} actions={jobs} jobId={id} text={text} />,
          id => void (model.jobs?.some(j => j.id === id) || model.refreshJobs())
        );
        output.addClass('jp-gpualloc-job-output');
        return output;
      }
    },
    {
      safe: true,
      mimeTypes: [LEASE_MIME],
      defaultRank: OUTPUT_RANK,
      createRenderer: () => {
        const output = new LiveOutput(model, LEASE_MIME, 'lease_id', (id, text) => (
          <LeaseOutputBody model={model} actions={slices} leaseId={id} text={text} />
        ));
        output.addClass('jp-gpualloc-lease-output');
        return output;
      }
    }
  ];
}
