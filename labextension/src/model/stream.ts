/**
 * How the panel reaches the server's event stream. An EventSource cannot send headers, so the
 * credentials that `ServerConnection` sends as headers go in the query: the token (when the page
 * has one) and the `_xsrf` cookie's value, which jupyter_server checks on every request that a
 * token does not vouch for (under JupyterHub, cookie-authenticated requests). A stream the server
 * refused is closed for good by the browser, so the panel opens it again after a growing delay.
 */

/** The event stream's query: `token` and `_xsrf` where known. */
export function streamQuery(token: string, cookies: string): Record<string, string> {
  const query: Record<string, string> = {};
  if (token) {
    query.token = token;
  }
  const xsrf = cookies
    .split(';')
    .map(part => part.trim())
    .find(part => part.startsWith('_xsrf='));
  if (xsrf) {
    query._xsrf = decodeURIComponent(xsrf.slice('_xsrf='.length));
  }
  return query;
}

/** Milliseconds before the next try after `failures` failed tries in a row: 1 s doubling, at most 30 s. */
export function reconnectDelay(failures: number): number {
  return Math.min(30_000, 1000 * 2 ** Math.max(0, failures - 1));
}

/** Milliseconds before the next check of a server that stopped answering: 10 s, then doubling to 5 minutes. */
export function recheckDelay(checksSoFar: number): number {
  return Math.min(10_000 * 2 ** Math.max(0, checksSoFar), 300_000);
}
