import React, { useState } from 'react';

import { requestHint } from '../model/request';
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
  /** Each kind of holder that gets no slice here, with why: a refused 'kernel' disables the button and says why. */
  refusedHolders: Record<string, string>;
  request: (offer: string, kernelId: string) => void;
}): JSX.Element {
  const [choice, setChoice] = useState('');
  const offers = props.offers;
  if (offers.length === 0) {
    return <p className="jp-gpualloc-muted">No offers.</p>;
  }
  const selected = offers.find(o => o.name === choice) ?? offers[0];
  const kernelId = props.notebook?.kernelId ?? null;
  const hint = requestHint(props.notebook?.path ?? null, kernelId, props.held, props.refusedHolders);
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
        disabled={!kernelId || hint !== ''}
        onClick={() => kernelId && props.request(selected.name, kernelId)}
      >
        Request for this notebook
      </Action>
      {hint && (
        <p className="jp-gpualloc-muted" data-refused={props.refusedHolders.kernel ? 'kernel' : undefined}>
          {hint}
        </p>
      )}
    </div>
  );
}
