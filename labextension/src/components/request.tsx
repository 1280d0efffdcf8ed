import React, { useState } from 'react';

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
  request: (offer: string, kernelId: string) => void;
}): JSX.Element {
  const [choice, setChoice] = useState('');
  const offers = props.offers;
  if (offers.length === 0) {
    return <p className="jp-gpualloc-muted">No offers.</p>;
  }
  const selected = offers.find(o => o.name === choice) ?? offers[0];
  const kernelId = props.notebook?.kernelId ?? null;
  let hint = '';
  if (!props.notebook) {
    hint = 'Open a notebook to request a slice for its kernel.';
  } else if (!kernelId) {
    hint = `${props.notebook.path} has no running kernel.`;
  } else if (props.held) {
    hint = `The kernel of ${props.notebook.path} already has a slice or a request.`;
  }
  return (
    <div className="jp-gpualloc-request">
      <ul className="jp-gpualloc-offers" aria-label="offers">
        {offers.map(offer => (
          <li key={offer.name} data-offer={offer.name}>
            <span>{offer.label}</span>
            {offer.over_usage_quota ? (
              <span className="jp-gpualloc-muted" title={offer.over_usage_quota}>
                usage quota used up
              </span>
            ) : (
              <span className={offer.available > 0 ? 'jp-gpualloc-ok' : 'jp-gpualloc-muted'}>
                {offer.available > 0 ? `${offer.available} free now` : 'none free: you would wait'}
              </span>
            )}
          </li>
        ))}
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
        label={props.notebook ? `Request ${selected.label} for ${props.notebook.path}` : 'Request a slice'}
        disabled={!kernelId || props.held}
        onClick={() => kernelId && props.request(selected.name, kernelId)}
      >
        Request for this notebook
      </Action>
      {hint && <p className="jp-gpualloc-muted">{hint}</p>}
    </div>
  );
}
