/** The GPUs panel of the left sidebar: Fleet, My slices, Usage, Request, Jobs. */

import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import { ISignal } from '@lumino/signaling';
import React from 'react';

import { GpuModel } from './gpumodel';
import { Action, Section } from './components/common';
import { Fleet } from './components/fleet';
import { IJobActions, Jobs } from './components/jobs';
import { ICurrentNotebook, Request } from './components/request';
import { ISliceActions, MySlices } from './components/slices';
import { Usage } from './components/usage';
import { offerLabel } from './model/charts';
import { Question } from './model/format';

export interface IPanelContext {
  model: GpuModel;
  /** The current notebook and its kernel, and a signal when either changes. */
  currentNotebook(): ICurrentNotebook | null;
  currentChanged: ISignal<unknown, unknown>;
  slices: ISliceActions;
  jobs: IJobActions;
  /** Ask a question before an action that cannot be undone; true when the answer is yes. */
  confirm(question: Question): Promise<boolean>;
}

/** GPU features are off on this server, or it has stopped: why, and a button to ask it again. Nothing else
 * is fetched meanwhile. */
function Paused(props: { model: GpuModel }): JSX.Element {
  const { model } = props;
  const off = model.phase === 'off';
  return (
    <div className="jp-gpualloc-body">
      <header className="jp-gpualloc-header">
        <h2>GPUs</h2>
        <span className="jp-gpualloc-live">{off ? 'off' : 'server stopped'}</span>
      </header>
      <div className="jp-gpualloc-banner" role="status" data-phase={model.phase}>
        {off ? model.offReason : model.unreachable}
      </div>
      <p className="jp-gpualloc-muted">
        {off ? 'Checked again every minute.' : 'Checked again now and then, less often as time goes by.'}
      </p>
      <Action label="Check the server again now" onClick={() => void model.recheck()}>
        Check again
      </Action>
    </div>
  );
}

function PanelBody(props: { context: IPanelContext }): JSX.Element {
  const { model, confirm } = props.context;
  if (model.phase === 'off' || model.phase === 'stopped') {
    return <Paused model={model} />;
  }
  const notebook = props.context.currentNotebook();
  const mine = new Set(model.slices.map(l => l.id));
  const held = !!notebook?.kernelId && model.slices.some(l => l.holder === `kernel:${notebook.kernelId}`);
  return (
    <div className="jp-gpualloc-body">
      <header className="jp-gpualloc-header">
        <h2>GPUs</h2>
        <span
          className={`jp-gpualloc-live${model.connected ? ' jp-mod-on' : ''}`}
          title={model.connected ? 'live updates' : 'updates every few seconds (event stream down)'}
        >
          {model.connected ? 'live' : 'polling'}
        </span>
      </header>
      {[model.unreachable, model.error].filter(Boolean).map(message => (
        <div key={message} className="jp-gpualloc-error" role="alert">
          {message}
        </div>
      ))}
      <Section id="fleet" title="Fleet">
        <Fleet inventory={model.inventory} mine={mine} unavailable={!!model.unreachable} />
      </Section>
      <Section id="mine" title="My slices">
        <MySlices
          slices={model.slices}
          warnings={model.stream.warnings}
          deadlineWarnings={model.stream.deadlineWarnings}
          ended={model.stream.ended}
          notes={model.notes}
          restarts={model.restarts}
          actions={props.context.slices}
        />
      </Section>
      <Section id="usage" title="Usage">
        <Usage usage={model.usage} labelOf={offer => offerLabel(model.offers, offer)} />
      </Section>
      <Section id="request" title="Request">
        {model.reservations.map(r => (
          <p key={r.name} className="jp-gpualloc-reservation" data-reservation={r.name}>
            {r.summary}
          </p>
        ))}
        <Request
          offers={model.offers}
          notebook={notebook}
          held={held}
          rules={model.kernelRules}
          request={(offer, kernelId) => void model.request(offer, kernelId)}
          restart={(offer, path, kernelId) => void model.restartAsGpuKernel(offer, path, kernelId, confirm)}
        />
      </Section>
      <Section id="jobs" title="Jobs">
        <Jobs jobs={model.jobs} api={model.api} actions={props.context.jobs} />
      </Section>
    </div>
  );
}

export class GpuPanel extends ReactWidget {
  constructor(private context: IPanelContext) {
    super();
    this.addClass('jp-gpualloc-panel');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.context.model.changed}>
        {() => (
          <UseSignal signal={this.context.currentChanged}>
            {() => <PanelBody context={this.context} />}
          </UseSignal>
        )}
      </UseSignal>
    );
  }
}
