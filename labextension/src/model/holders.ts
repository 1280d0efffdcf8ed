/**
 * The holder grammar of jupyter_gpualloc/core/holders.py, for the panel: "server", "server:<name>",
 * "kernel:<id>" or "job:<id>". Both follow tests/holder_grammar.json (checked by vitest and pytest).
 */

export const HOLDER_KINDS = ['server', 'kernel', 'job'] as const;
export type HolderKind = (typeof HOLDER_KINDS)[number];

/** A parsed holder: its kind and its name ('' for the default server). */
export interface Holder {
  kind: HolderKind;
  name: string;
}

/** The holder `text` names, or null if it follows no form of the grammar. */
export function parseHolder(text: string): Holder | null {
  if (text === 'server') {
    return { kind: 'server', name: '' };
  }
  const colon = text.indexOf(':');
  if (colon < 0) {
    return null;
  }
  const kind = text.slice(0, colon);
  const name = text.slice(colon + 1);
  if (!name || !(HOLDER_KINDS as readonly string[]).includes(kind)) {
    return null;
  }
  return { kind: kind as HolderKind, name };
}

/** The kernel id of a kernel's holder, else null. */
export function kernelOf(holder: string): string | null {
  const parsed = parseHolder(holder);
  return parsed?.kind === 'kernel' ? parsed.name : null;
}

/** The job id of a job's holder, else null. */
export function jobOf(holder: string): string | null {
  const parsed = parseHolder(holder);
  return parsed?.kind === 'job' ? parsed.name : null;
}

/** Whether the holder is a server ('server' or 'server:<name>'). */
export function isServer(holder: string): boolean {
  return parseHolder(holder)?.kind === 'server';
}
