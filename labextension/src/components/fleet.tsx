import React from 'react';

import { gib } from '../model/format';
import { gpuCondition, gpuMemory, memorySlices, migBlocks, Owner, shareSegments } from '../model/fleet';
import { Gpu, Inventory } from '../model/types';

const OWNER_WORDS: Record<Owner, string> = { mine: 'mine', other: 'taken', free: 'free' };

function who(owner: Owner, user: string | null): string {
  return owner === 'other' && user ? `taken by ${user}` : OWNER_WORDS[owner];
}

function MigGpu(props: { gpu: Gpu; mine: ReadonlySet<string> }): JSX.Element {
  const total = memorySlices(props.gpu);
  const blocks = migBlocks(props.gpu, props.mine);
  return (
    <ul
      className="jp-gpualloc-mig"
      style={{ gridTemplateColumns: `repeat(${total}, 1fr)` }}
      aria-label={`${total} memory slices`}
    >
      {blocks.map(block => {
        const label = block.profile
          ? `${block.profile} at slice ${block.start}: ${who(block.owner, block.user)}`
          : `slice ${block.start}: free`;
        return (
          <li
            key={`${block.start}-${block.size}`}
            className={`jp-gpualloc-block jp-mod-${block.owner}${block.profile ? '' : ' jp-mod-unused'}`}
            style={{ gridColumn: `${block.start + 1} / span ${block.size}` }}
            data-start={block.start}
            data-size={block.size}
            data-owner={block.owner}
            title={label}
            aria-label={label}
          >
            {block.profile ?? ''}
          </li>
        );
      })}
    </ul>
  );
}

function SharedGpu(props: { gpu: Gpu; mine: ReadonlySet<string> }): JSX.Element {
  const segments = shareSegments(props.gpu, props.mine);
  return (
    <ul className="jp-gpualloc-shares" aria-label="memory caps">
      {segments.map((segment, i) => {
        const label = `${gib(segment.memoryMib)} GiB ${segment.kind === 'free' ? 'free' : who(segment.owner, segment.user)}`;
        return (
          <li
            key={segment.leaseId ?? `free-${i}`}
            className={`jp-gpualloc-share jp-mod-${segment.owner}`}
            style={{ flexGrow: segment.fraction }}
            data-owner={segment.owner}
            title={label}
            aria-label={label}
          />
        );
      })}
    </ul>
  );
}

/** The fleet drawing; `unavailable`: it could not be read (the panel says why above). */
export function Fleet(props: {
  inventory: Inventory | null;
  mine: ReadonlySet<string>;
  unavailable?: boolean;
}): JSX.Element {
  const inventory = props.inventory;
  if (!inventory) {
    return <p className="jp-gpualloc-muted">{props.unavailable ? 'No fleet to show.' : 'Loading the fleet…'}</p>;
  }
  const unusable = inventory.unusable_nodes ?? [];
  if (inventory.nodes.length === 0 && unusable.length === 0) {
    return <p className="jp-gpualloc-muted">No GPUs.</p>;
  }
  return (
    <div className="jp-gpualloc-fleet">
      {inventory.nodes.map(node => (
        <div key={node.name} className="jp-gpualloc-node">
          <div className="jp-gpualloc-node-name">{node.name}</div>
          {node.gpus.map(gpu => {
            const memory = gpuMemory(gpu);
            const condition = gpuCondition(gpu);
            return (
              <div key={gpu.uuid} className="jp-gpualloc-gpu" data-uuid={gpu.uuid}>
                <div className="jp-gpualloc-gpu-title">
                  <span>
                    GPU {gpu.index ?? ''} {gpu.model}
                    {gpu.mig_mode !== 'off' ? ' (MIG)' : ''}
                  </span>
                  <span className="jp-gpualloc-muted">
                    {gib(memory.usedMib)}/{gib(memory.totalMib)} GiB held
                  </span>
                  {condition && <span className="jp-gpualloc-badge jp-mod-warn">{condition}</span>}
                </div>
                {gpu.mig_mode !== 'off' ? (
                  <MigGpu gpu={gpu} mine={props.mine} />
                ) : (
                  <SharedGpu gpu={gpu} mine={props.mine} />
                )}
              </div>
            );
          })}
        </div>
      ))}
      {unusable.map(node => (
        <div key={node.name} className="jp-gpualloc-node jp-mod-unusable" data-node={node.name}>
          <div className="jp-gpualloc-node-name">
            {node.name} <span className="jp-gpualloc-badge jp-mod-warn">unusable</span>
          </div>
          <div className="jp-gpualloc-muted">{node.reason}</div>
        </div>
      ))}
      <Legend />
    </div>
  );
}

function Legend(): JSX.Element {
  return (
    <div className="jp-gpualloc-legend" aria-hidden="true">
      <span className="jp-gpualloc-swatch jp-mod-mine" /> mine
      <span className="jp-gpualloc-swatch jp-mod-other" /> taken
      <span className="jp-gpualloc-swatch jp-mod-free" /> free
    </div>
  );
}
