import { describe, expect, it } from 'vitest';

import { reconnectDelay, streamQuery } from '../src/model/stream';

describe('the event stream query', () => {
  it('carries the token and the _xsrf cookie', () => {
    expect(streamQuery('tok', 'a=1; _xsrf=2%7Cab%7Ccd; b=2')).toEqual({ token: 'tok', _xsrf: '2|ab|cd' });
  });

  it('carries the _xsrf cookie alone under JupyterHub (no token in the page)', () => {
    expect(streamQuery('', '_xsrf=xyz')).toEqual({ _xsrf: 'xyz' });
  });

  it('is empty without credentials, and ignores cookies that only end in _xsrf', () => {
    expect(streamQuery('', 'my_xsrf=nope; other=1')).toEqual({});
  });
});

describe('reconnecting', () => {
  it('waits longer after each failure, at most 30 s', () => {
    expect([1, 2, 3, 4, 5, 6, 7, 20].map(reconnectDelay)).toEqual([1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
  });
});
