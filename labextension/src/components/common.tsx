import { Button } from '@jupyterlab/ui-components';
import React, { useEffect, useState } from 'react';

import { formatCountdown, idleReleaseText, secondsLeft } from '../model/countdown';
import { LeaseEntry } from '../model/types';

/** A small labelled button: `label` is read by screen readers, `children` shown. */
export function Action(props: {
  label: string;
  onClick: () => void;
  children: React.ReactNode;
  disabled?: boolean;
  warn?: boolean;
}): JSX.Element {
  return (
    <Button
      small
      className={`jp-gpualloc-action${props.warn ? ' jp-mod-warn' : ''}`}
      aria-label={props.label}
      title={props.label}
      disabled={props.disabled}
      onClick={props.onClick}
    >
      {props.children}
    </Button>
  );
}

/** The current time in ms, re-rendering every `everyMs`. */
export function useNow(everyMs = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = window.setInterval(() => setNow(Date.now()), everyMs);
    return () => window.clearInterval(timer);
  }, [everyMs]);
  return now;
}

/** "released in 1:15" until the idle-warned slice is released. */
export function Countdown(props: { releaseAt: number }): JSX.Element {
  const left = secondsLeft(props.releaseAt, useNow());
  return (
    <span className="jp-gpualloc-countdown" role="timer" aria-live="off">
      idle: released in {formatCountdown(left)}
    </span>
  );
}

/** Before any idle warning: "idle release in 6 min (warned at 14:05:09, then a 5 min grace)", ticking down. */
export function IdleRelease(props: { lease: LeaseEntry }): JSX.Element | null {
  const text = idleReleaseText(props.lease, useNow());
  return text ? (
    <div className="jp-gpualloc-idle jp-gpualloc-muted" role="timer" aria-live="off">
      {text}
    </div>
  ) : null;
}

/** A section of the panel with its heading. */
export function Section(props: { id: string; title: string; children: React.ReactNode }): JSX.Element {
  return (
    <section className="jp-gpualloc-section" aria-labelledby={`jp-gpualloc-${props.id}`}>
      <h3 id={`jp-gpualloc-${props.id}`} className="jp-gpualloc-heading">
        {props.title}
      </h3>
      {props.children}
    </section>
  );
}
