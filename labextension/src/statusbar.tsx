/** The status-bar item: my GPU slices at a glance; a click opens the GPUs panel. */

import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import React from 'react';

import { GpuModel } from './gpumodel';
import { statusText, statusTitle } from './model/format';

export class GpuStatus extends ReactWidget {
  constructor(
    private model: GpuModel,
    private open: () => void
  ) {
    super();
    this.addClass('jp-gpualloc-status');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => {
          const text = statusText(this.model.slices);
          return (
            <button
              className="jp-gpualloc-status-button"
              onClick={this.open}
              aria-label={`${text}: open the GPUs panel`}
              title={statusTitle(this.model.slices)}
            >
              {text}
            </button>
          );
        }}
      </UseSignal>
    );
  }
}
