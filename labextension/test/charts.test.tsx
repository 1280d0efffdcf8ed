/** The sidebar's sparkline of a slice's SM utilisation and the chart of my GPU-hours per day by offer (issue 40). */
import React from 'react';
import { renderToStaticMarkup } from 'react-dom/server';
import { describe, expect, it } from 'vitest';

import { Sparkline, UsageChart } from '../src/components/charts';
import { lastDays, offerLabel, sparklineView, usageChartView } from '../src/model/charts';
import { Offer, RecentUtilization, UsageDay } from '../src/model/types';

const NOW = 10_000;
const recent = (...samples: [number, number][]): RecentUtilization => ({
  window: 600,
  now: NOW,
  samples: samples.map(([at, sm_percent]) => ({ at, sm_percent }))
});

describe('the utilisation sparkline', () => {
  it('puts time left to right over the window and 100 % at the top', () => {
    const view = sparklineView(recent([NOW - 600, 0], [NOW - 300, 50], [NOW, 100]), 80, 16);
    expect(view).toEqual({
      points: '0,16 40,8 80,0',
      latest: 100,
      label: 'SM utilisation over the last 10 min: now 100 %, peak 100 %'
    });
  });

  it('clamps what is out of the box, draws one sample as a dash, and is null without samples', () => {
    expect(sparklineView(recent([NOW - 900, 120], [NOW, 70.4]), 80, 16)?.points).toBe('0,0 80,4.7');
    expect(sparklineView(recent([NOW, 30]), 80, 16)?.points).toBe('78,11.2 80,11.2');
    expect(sparklineView(recent(), 80, 16)).toBeNull();
  });

  it('spans the time since the first sample when that is shorter than the window, at least a minute', () => {
    const young = sparklineView(recent([NOW - 120, 0], [NOW - 60, 50], [NOW, 100]), 80, 16);
    expect(young?.points).toBe('0,16 40,8 80,0');
    expect(young?.label).toBe('SM utilisation over the last 2 min: now 100 %, peak 100 %');
    const seconds = sparklineView(recent([NOW - 15, 10], [NOW, 20]), 80, 16);
    expect(seconds?.points).toBe('60,14.4 80,12.8');
    expect(seconds?.label).toBe('SM utilisation over the last 60 s: now 20 %, peak 20 %');
  });

  it('renders an inline SVG with its reading, "not measured" without samples, nothing when not told', () => {
    const html = renderToStaticMarkup(<Sparkline utilization={recent([NOW - 60, 20], [NOW, 70])} />);
    expect(html).toContain('<svg class="jp-gpualloc-sparkline" role="img"');
    expect(html).toContain('aria-label="SM utilisation over the last 60 s: now 70 %, peak 70 %"');
    expect(html).toContain('<polyline points="0,12.8 80,4.8">');
    expect(html).toMatch(/data-measured="true".*SM 70 %<\/div>$/);
    const unmeasured = renderToStaticMarkup(<Sparkline utilization={recent()} />);
    expect(unmeasured).toContain('data-measured="false"');
    expect(unmeasured).toContain('SM utilisation not measured');
    expect(unmeasured).not.toContain('<svg');
    expect(renderToStaticMarkup(<Sparkline utilization={null} />)).toBe('');
  });
});

const HISTORY: UsageDay[] = [
  { day: '2026-12-05', gpu_hours: 3, offers: { 'mig-1g.5gb': 1, 'shared-8gb': 2 } },
  { day: '2026-12-07', gpu_hours: 1.5, offers: { 'mig-1g.5gb': 1.5 } },
  { day: '2026-11-01', gpu_hours: 9, offers: { 'shared-8gb': 9 } } // before the chart's days
];
const OFFERS: Offer[] = [
  { name: 'mig-1g.5gb', label: 'MIG 1g.5gb', spec: {}, available: 1 },
  { name: 'shared-8gb', label: 'Shared 8 GiB', spec: {}, available: 1 }
];
const labelOf = (offer: string) => offerLabel(OFFERS, offer);

describe('the chart of my GPU-hours per day by offer', () => {
  it('lists the days ending today, across a month', () => {
    expect(lastDays('2026-12-02', 4)).toEqual(['2026-11-29', '2026-11-30', '2026-12-01', '2026-12-02']);
  });

  it('stacks each day by offer against the busiest day, most used offer first', () => {
    const view = usageChartView(HISTORY, lastDays('2026-12-07', 4), labelOf, 40, 30);
    expect(view.bars.map(b => b.day)).toEqual(['2026-12-04', '2026-12-05', '2026-12-06', '2026-12-07']);
    expect(view.top).toBe(3);
    expect(view.barWidth).toBe(8);
    expect(view.bars[0].parts).toEqual([]);
    expect(view.bars[1]).toEqual({
      day: '2026-12-05',
      x: 11,
      parts: [
        { offer: 'mig-1g.5gb', series: 0, y: 20, height: 10 },
        { offer: 'shared-8gb', series: 1, y: 0, height: 20 }
      ],
      title: '2026-12-05: 3 GPU-hours (MIG 1g.5gb 1, Shared 8 GiB 2)'
    });
    expect(view.bars[3].parts).toEqual([{ offer: 'mig-1g.5gb', series: 0, y: 15, height: 15 }]);
    expect(view.legend).toEqual([
      { offer: 'mig-1g.5gb', label: 'MIG 1g.5gb', series: 0, hours: '2.5' },
      { offer: 'shared-8gb', label: 'Shared 8 GiB', series: 1, hours: '2' }
    ]);
    expect(view.label).toBe('My GPU-hours per day over the last 4 days: 4.5 in all');
  });

  it('names a request of no offer, shares the last colour past the palette, and has an empty scale unused', () => {
    expect(offerLabel(OFFERS, '')).toBe('own sizes');
    expect(offerLabel(OFFERS, 'gone-offer')).toBe('gone-offer');
    const many: UsageDay[] = [{ day: '2026-12-07', gpu_hours: 6, offers: { a: 3, b: 2, '': 1 } }];
    expect(usageChartView(many, ['2026-12-07'], labelOf, 10, 10, 2).legend.map(l => [l.label, l.series])).toEqual([
      ['a', 0],
      ['b', 1],
      ['own sizes', 1]
    ]);
    const empty = usageChartView([], lastDays('2026-12-07', 14), labelOf, 200, 48);
    expect(empty.top).toBe(0);
    expect(empty.bars.every(b => b.parts.length === 0)).toBe(true);
  });

  it('renders one bar group per day with its title, and a legend of offers', () => {
    const html = renderToStaticMarkup(<UsageChart history={HISTORY} labelOf={labelOf} today="2026-12-07" />);
    expect(html.match(/<g data-day=/g)).toHaveLength(14);
    expect(html).toContain('<title>2026-12-07: 1.5 GPU-hours (MIG 1g.5gb 1.5)</title>');
    expect(html).toContain('data-offer="shared-8gb"');
    expect(html).toMatch(/class="jp-gpualloc-legend" data-offer="mig-1g.5gb">.*MIG 1g.5gb 2.5<\/span>/);
    expect(renderToStaticMarkup(<UsageChart history={[]} labelOf={labelOf} today="2026-12-07" />)).toContain(
      'No GPU use in the last 14 days.'
    );
  });
});
