import { readFileSync } from 'fs';
import { join } from 'path';
import { describe, expect, it } from 'vitest';

import { HOLDER_KINDS, isServer, jobOf, kernelOf, parseHolder } from '../src/model/holders';

const grammar = JSON.parse(readFileSync(join(__dirname, '..', '..', 'tests', 'holder_grammar.json'), 'utf-8'));

describe('the holder grammar', () => {
  it('knows the kinds core/holders.py knows', () => {
    expect([...HOLDER_KINDS]).toEqual(grammar.kinds);
  });

  it('parses every shared case as the core does', () => {
    for (const [text, expected] of grammar.cases) {
      const parsed = parseHolder(text);
      expect(parsed === null ? null : [parsed.kind, parsed.name]).toEqual(expected);
    }
  });

  it('names kernels, jobs and servers', () => {
    expect(kernelOf('kernel:abc')).toBe('abc');
    expect(kernelOf('job:abc')).toBeNull();
    expect(jobOf('job:7')).toBe('7');
    expect(isServer('server:x') && !isServer('kernel:x')).toBe(true);
  });
});
