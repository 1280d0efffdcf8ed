import React, { useState } from 'react';

import {
  KernelRules,
  offerAvailability,
  requestAction,
  requestButtonLabel,
  requestButtonText
} from '../model/request';
import { Offer } from '../model/types';
import { Action } from './common';

export interface ICurrentNotebook {
  path: string;
  kernelId: string | null;
}

export function Request(props: {
  offers: Offer[];
  notebook: ICurrentNotebook | null;
  held: boolean;
  /** A refused 'kernel' disables the button and says why, unless GPU kernels run in pods of their own:
   * then the button restarts the notebook's kernel as one. */
  rules: KernelRules;
  request: (offer: string, kernelId: string) => void;
  restart: (offer: Offer, notebookPath: string, kernelId: string) => void;
}): JSX.Element {
  const [choice, setChoice] = useState('');
  const offers = props.offers;
  if (offers.length === 0) {
    return <p className="jp-gpualloc-muted">No offers.</p>;
  }
  const selected = offers.find(o => o.name === choice) ?? offers[0];
  const path = props.notebook?.path ?? null;
  const action = requestAction(path, props.notebook?.kernelId ?? null, props.held, props.rules);
  const refused = !props.rules.kernelPods && !!props.rules.refusedHolders.kernel;
  return (
    <div className="jp-gpualloc-request">
      <ul className="jp-gpualloc-offers" aria-label="offers">
        {offers.map(offer => {
          const availability = offerAvailability(offer);
          return (
            <li key={offer.name} data-offer={offer.name} data-availability={availability.state}>
              <span>{offer.label}</span>
              <span
                className={availability.state === 'free' ? 'jp-gpualloc-ok' : 'jp-gpualloc-muted'}
                title={availability.why ?? undefined}
              >
                {availability.text}
              </span>
            </li>
          );
        })}
      </ul>
      <label className="jp-gpualloc-field">
        <span>Slice</span>
        <select
          className="jp-mod-styled"
          value={selected.name}
          onChange={event => setChoice(event.target.value)}
          aria-label="Slice to request"
        >
          {offers.map(offer => (
            <option key={offer.name} value={offer.name}>
              {offer.label}
            </option>
          ))}
        </select>
      </label>
      <Action
        label={requestButtonLabel(props.rules, path, selected)}
        disabled={action.kind === 'none'}
        onClick={() => {
          if (action.kind === 'restart') {
            props.restart(selected, action.notebookPath, action.kernelId);
          } else if (action.kind === 'request') {
            props.request(selected.name, action.kernelId);
          }
        }}
      >
        {requestButtonText(props.rules)}
      </Action>
      {action.kind === 'none' && (
        <p className="jp-gpualloc-muted" data-refused={refused ? 'kernel' : undefined}>
          {action.why}
        </p>
      )}
    </div>
  );
}
