import React from 'react';

import { formatHours, quotaView } from '../model/usage';
import { UsageChart } from './charts';
import { UsageReport } from '../model/types';

const STATE_WORDS = { warning: 'almost used up', exceeded: 'used up' };

/** My usage quotas, each a bar with what is used, the limit and when it resets; this month's total; and my
 * GPU-hours per day of the last two weeks by offer (`labelOf` names an offer). */
export function Usage(props: { usage: UsageReport | null; labelOf: (offer: string) => string }): JSX.Element {
  const usage = props.usage;
  if (!usage) {
    return <p className="jp-gpualloc-muted">No usage report from the allocator.</p>;
  }
  return (
    <div className="jp-gpualloc-usage">
      {usage.quotas.map(quota => {
        const view = quotaView(quota);
        return (
          <div key={view.key} className={`jp-gpualloc-quota jp-mod-${view.state}`} data-state={view.state}>
            <div className="jp-gpualloc-quota-title">
              <span>{view.title}</span>
              <span>{view.amount}</span>
            </div>
            <div
              className="jp-gpualloc-bar"
              role="meter"
              aria-label={`${view.title}: ${view.amount}`}
              aria-valuemin={0}
              aria-valuemax={100}
              aria-valuenow={Math.round(view.percent)}
            >
              <div className="jp-gpualloc-bar-fill" style={{ width: `${view.percent}%` }} />
            </div>
            <div className="jp-gpualloc-muted">
              {view.state !== 'ok' && (
                <span className="jp-gpualloc-badge jp-mod-warn">{STATE_WORDS[view.state]}</span>
              )}{' '}
              {view.sentence}
            </div>
          </div>
        );
      })}
      <p className="jp-gpualloc-muted">
        {usage.quotas.length === 0 ? 'No usage quota. ' : ''}This month: {formatHours(usage.total.gpu_hours)} GPU-hours.
      </p>
      {usage.history && (
        <UsageChart history={usage.history} labelOf={props.labelOf} today={new Date().toISOString().slice(0, 10)} />
      )}
    </div>
  );
}
