/**
 * The output a `%%gpu job` cell leaves in its notebook, rendered from REST API v1 instead of from
 * a widget model: a reopened notebook, or one whose kernel restarted, still shows the job as it
 * is now (state, runtime, Logs, Cancel), never "Error displaying widget: model not found".
 */

import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import React from 'react';

import { GpuModel } from '../gpumodel';
import { useNow } from './common';
import { IJobActions, JobItem } from './jobs';

/** The MIME type of a job's output; its data is `{"job_id": "..."}` (see kernel/job_widget.py). */
export const JOB_MIME = 'application/vnd.jupyter-gpualloc.job+json';
/** Ahead of ipywidgets' widget view (rank -10 in jupyterlab_widgets), which the bundle also carries. */
export const JOB_MIME_RANK = -20;

function JobOutputBody(props: { model: GpuModel; actions: IJobActions; jobId: string; text: string }) {
  const now = useNow();
  const job = props.model.jobs?.find(j => j.id === props.jobId);
  if (!job) {
    return (
      <div className="jp-gpualloc-muted" data-job={props.jobId}>
        {props.text || `GPU job ${props.jobId}`} (not among your jobs now)
      </div>
    );
  }
  return (
    <ul className="jp-gpualloc-list">
      <JobItem job={job} api={props.model.api} actions={props.actions} now={now} />
    </ul>
  );
}

export class JobOutput extends ReactWidget implements IRenderMime.IRenderer {
  private jobId = '';
  private text = '';

  constructor(
    private readonly model: GpuModel,
    private readonly actions: IJobActions
  ) {
    super();
    this.addClass('jp-gpualloc-job-output');
  }

  async renderModel(mimeModel: IRenderMime.IMimeModel): Promise<void> {
    const data = mimeModel.data[JOB_MIME] as { job_id?: string } | undefined;
    this.jobId = String(data?.job_id ?? '');
    this.text = String(mimeModel.data['text/plain'] ?? '');
    if (!this.model.jobs?.some(j => j.id === this.jobId)) {
      void this.model.refreshJobs();
    }
    this.update();
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => <JobOutputBody model={this.model} actions={this.actions} jobId={this.jobId} text={this.text} />}
      </UseSignal>
    );
  }
}

/** The renderer factory for job outputs, sharing the panel's model (one poll of the jobs for both). */
export function jobOutputFactory(model: GpuModel, actions: IJobActions): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [JOB_MIME],
    defaultRank: JOB_MIME_RANK,
    createRenderer: () => new JobOutput(model, actions)
  };
}
