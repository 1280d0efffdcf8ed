/** The panel's small inline SVG charts: a slice's SM utilisation sparkline and my GPU-hours per day by offer.
 * Plain React and SVG (no JupyterLab widgets), coloured by the theme's variables in style/base.css. */

import React from 'react';

import { lastDays, sparklineView, usageChartView } from '../model/charts';
import { RecentUtilization, UsageDay } from '../model/types';

const SPARK = { width: 80, height: 16 };
const CHART = { width: 200, height: 48 };
export const HISTORY_DAYS = 14;

/** "SM 70 %" after a sparkline of the last minutes; "SM utilisation not measured" where nothing samples it;
 * nothing when the allocator does not say (a queued slice, an older service). */
export function Sparkline(props: { utilization?: RecentUtilization | null }): JSX.Element | null {
  if (!props.utilization) {
    return null;
  }
  const view = sparklineView(props.utilization, SPARK.width, SPARK.height);
  if (!view) {
    return (
      <div className="jp-gpualloc-util jp-gpualloc-muted" data-measured="false">
        SM utilisation not measured
      </div>
    );
  }
  return (
    <div className="jp-gpualloc-util" data-measured="true" data-latest={view.latest} title={view.label}>
      <svg
        className="jp-gpualloc-sparkline"
        role="img"
        aria-label={view.label}
        width={SPARK.width}
        height={SPARK.height}
        viewBox={`0 0 ${SPARK.width} ${SPARK.height}`}
      >
        <line className="jp-gpualloc-sparkline-base" x1={0} y1={SPARK.height} x2={SPARK.width} y2={SPARK.height} />
        <polyline points={view.points} />
      </svg>{' '}
      SM {view.latest} %
    </div>
  );
}

/** My GPU-hours per day over the last two weeks as stacked bars, one colour per offer, with a legend. */
export function UsageChart(props: {
  history: UsageDay[];
  labelOf: (offer: string) => string;
  /** Today, YYYY-MM-DD (UTC): the last bar. */
  today: string;
}): JSX.Element {
  const view = usageChartView(props.history, lastDays(props.today, HISTORY_DAYS), props.labelOf, CHART.width, CHART.height);
  return (
    <figure className="jp-gpualloc-usage-chart" aria-label={view.label}>
      <svg
        role="img"
        aria-label={view.label}
        width="100%"
        height={CHART.height}
        viewBox={`0 0 ${CHART.width} ${CHART.height}`}
        preserveAspectRatio="none"
      >
        {view.bars.map(bar => (
          <g key={bar.day} data-day={bar.day}>
            <title>{bar.title}</title>
            <rect className="jp-gpualloc-chart-slot" x={bar.x} y={0} width={view.barWidth} height={CHART.height} />
            {bar.parts.map(part => (
              <rect
                key={part.offer}
                className={`jp-gpualloc-series-${part.series}`}
                data-offer={part.offer}
                x={bar.x}
                y={part.y}
                width={view.barWidth}
                height={part.height}
              />
            ))}
          </g>
        ))}
      </svg>
      <figcaption className="jp-gpualloc-muted">
        {view.legend.length === 0
          ? `No GPU use in the last ${HISTORY_DAYS} days.`
          : `GPU-hours per day, last ${HISTORY_DAYS} days:`}
        {view.legend.map(entry => (
          <span key={entry.offer} className="jp-gpualloc-legend" data-offer={entry.offer}>
            <span className={`jp-gpualloc-swatch jp-gpualloc-series-${entry.series}`} /> {entry.label} {entry.hours}
          </span>
        ))}
      </figcaption>
    </figure>
  );
}
