/** The status-bar item: my GPU slices at a glance, or a GPU kernel's wait for its slice; a click opens the
 * GPUs panel. */

import { ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import { ISignal } from '@lumino/signaling';
import React from 'react';

import { GpuModel } from './gpumodel';
import { statusBarText, statusTitle } from './model/format';

export class GpuStatus extends ReactWidget {
  /** `currentKernelId()`: the current notebook's kernel, whose wait for a slice is shown first;
   * `currentChanged` fires when it changes. */
  constructor(
    private model: GpuModel,
    private open: () => void,
    private currentKernelId: () => string | null,
    private currentChanged: ISignal<unknown, unknown>
  ) {
    super();
    this.addClass('jp-gpualloc-status');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this.model.changed}>
        {() => (
          <UseSignal signal={this.currentChanged}>
            {() => {
              const text = statusBarText(this.model.phase, this.model.slices, {
                kernelPods: this.model.kernelPods,
                currentKernelId: this.currentKernelId()
              });
              return (
                <button
                  className="jp-gpualloc-status-button"
                  onClick={this.open}
                  aria-label={`${text}: open the GPUs panel`}
                  title={
                    this.model.phase === 'on'
                      ? statusTitle(this.model.slices)
                      : (this.model.offReason ?? this.model.unreachable ?? 'asking the server…')
                  }
                >
                  {text}
                </button>
              );
            }}
          </UseSignal>
        )}
      </UseSignal>
    );
  }
}
