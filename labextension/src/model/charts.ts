/** The geometry and words of the panel's two small charts: a slice's SM utilisation over the last minutes
 * (a sparkline) and my GPU-hours per day, split by offer (stacked bars). */

import { formatSpan } from './countdown';
import { Offer, RecentUtilization, UsageDay } from './types';
import { formatHours } from './usage';

export interface SparklineView {
  /** SVG polyline points, "x,y x,y", in a width × height box (0 % at the bottom, 100 % at the top). */
  points: string;
  /** The last sample's SM %, rounded. */
  latest: number;
  /** "SM utilisation over the last 10 min: now 70 %, peak 85 %" (the span drawn). */
  label: string;
}

const round1 = (value: number) => Math.round(value * 10) / 10;

/** The shortest span a sparkline covers, in seconds: a slice sampled for a few seconds is not one pixel wide. */
export const SPARKLINE_MIN_SPAN = 60;

/**
 * The sparkline of a slice's samples, time running left to right up to now, over the window or, for a slice
 * sampled for less time than that, since its first sample (at least SPARKLINE_MIN_SPAN); null without samples.
 */
export function sparklineView(utilization: RecentUtilization, width: number, height: number): SparklineView | null {
  const samples = utilization.samples;
  if (samples.length === 0) {
    return null;
  }
  const span = Math.min(utilization.window, Math.max(SPARKLINE_MIN_SPAN, utilization.now - samples[0].at));
  const x = (at: number) => round1(width * Math.min(1, Math.max(0, 1 - (utilization.now - at) / span)));
  const y = (percent: number) => round1(height * (1 - Math.min(100, Math.max(0, percent)) / 100));
  const points = samples.map(s => `${x(s.at)},${y(s.sm_percent)}`);
  if (samples.length === 1) {
    points.unshift(`${Math.max(0, x(samples[0].at) - 2)},${y(samples[0].sm_percent)}`); // a dot shows as a dash
  }
  const latest = Math.round(samples[samples.length - 1].sm_percent);
  const peak = Math.round(Math.max(...samples.map(s => s.sm_percent)));
  return {
    points: points.join(' '),
    latest,
    label: `SM utilisation over the last ${formatSpan(span)}: now ${latest} %, peak ${peak} %`
  };
}

export interface UsageBar {
  day: string;
  /** Left edge of the bar. */
  x: number;
  /** One rectangle per offer, bottom up in the legend's order; `series` picks its colour. */
  parts: { offer: string; series: number; y: number; height: number }[];
  /** "2026-12-07: 1.5 GPU-hours (MIG 1g.5gb 1, Shared 8 GiB 0.5)". */
  title: string;
}

export interface UsageChartView {
  bars: UsageBar[];
  barWidth: number;
  /** The offers used in the period, most used first, with their totals; `series` is the colour's index. */
  legend: { offer: string; label: string; series: number; hours: string }[];
  /** The largest day's GPU-hours, the top of the scale. */
  top: number;
  label: string;
}

/** The UTC days ending with `today` (YYYY-MM-DD), `count` of them, oldest first. */
export function lastDays(today: string, count: number): string[] {
  const end = Date.parse(`${today}T00:00:00Z`);
  return Array.from({ length: count }, (_, i) => new Date(end - (count - 1 - i) * 86_400_000).toISOString().slice(0, 10));
}

/**
 * Stacked bars of GPU-hours per day over `days` (oldest first; days without use stay empty), one colour per
 * offer (`labelOf` names it; at most `series` colours, the rest share the last). The scale's top is the busiest day.
 */
export function usageChartView(
  history: UsageDay[],
  days: string[],
  labelOf: (offer: string) => string,
  width: number,
  height: number,
  series = 5
): UsageChartView {
  const byDay = new Map(history.map(d => [d.day, d]));
  const totals = new Map<string, number>();
  for (const day of days) {
    for (const [offer, hours] of Object.entries(byDay.get(day)?.offers ?? {})) {
      totals.set(offer, (totals.get(offer) ?? 0) + hours);
    }
  }
  const order = [...totals.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).map(([offer]) => offer);
  const seriesOf = (offer: string) => Math.min(order.indexOf(offer), series - 1);
  const top = Math.max(0, ...days.map(day => byDay.get(day)?.gpu_hours ?? 0));
  const slot = width / Math.max(1, days.length);
  const barWidth = round1(Math.max(1, slot - 2));
  const bars = days.map((day, i) => {
    const entry = byDay.get(day);
    let base = height;
    const parts = order
      .filter(offer => (entry?.offers[offer] ?? 0) > 0)
      .map(offer => {
        const h = top > 0 ? (height * (entry?.offers[offer] ?? 0)) / top : 0;
        base -= h;
        return { offer, series: seriesOf(offer), y: round1(base), height: round1(h) };
      });
    const split = order
      .filter(offer => (entry?.offers[offer] ?? 0) > 0)
      .map(offer => `${labelOf(offer)} ${formatHours(entry?.offers[offer] ?? 0)}`);
    const title = `${day}: ${formatHours(entry?.gpu_hours ?? 0)} GPU-hours${split.length ? ` (${split.join(', ')})` : ''}`;
    return { day, x: round1(i * slot + 1), parts, title };
  });
  const total = [...totals.values()].reduce((a, b) => a + b, 0);
  return {
    bars,
    barWidth,
    legend: order.map(offer => ({
      offer,
      label: labelOf(offer),
      series: seriesOf(offer),
      hours: formatHours(totals.get(offer) ?? 0)
    })),
    top,
    label: `My GPU-hours per day over the last ${days.length} days: ${formatHours(total)} in all`
  };
}

/** An offer's label for the chart's legend: the offer's own, else its name; "" (no offer) is "own sizes". */
export function offerLabel(offers: Offer[], offer: string): string {
  return offers.find(o => o.name === offer)?.label ?? (offer || 'own sizes');
}
