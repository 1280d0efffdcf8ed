/** A refused call of the server extension's API, and how the panel words it. */

/** A refused call: the HTTP status and the server's message, for people. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

/** The tab's server no longer answers: the connection fails, or what answers (a proxy, the hub) does not
 * know the server's API. */
export class ServerStopped extends Error {}

/** Whether an answer that is not ok comes from something other than the server's own API (which always
 * answers JSON): a proxy's or the hub's 404/424/502/503 for a server that has stopped. */
export function notTheServer(status: number, json: boolean): boolean {
  return status === 424 || ([404, 502, 503].includes(status) && !json);
}

/** Why the panel has no fleet to show: GPU features off on this server (503, with what to set), or
 * the allocator not answering. */
export function unreachableText(err: unknown): string {
  const message = (err as Error)?.message ?? String(err);
  if (err instanceof ServerStopped) {
    return `The server stopped: ${message}`;
  }
  if (err instanceof ApiError && err.status === 503) {
    // the server's own message may say it already ("GPU slices and jobs are off: no GPU was found ...")
    return message.startsWith('GPU slices') ? message : `GPU slices are off on this server: ${message}`;
  }
  return `The GPU allocator cannot be reached: ${message}`;
}

/** A refused call in plain words (quota, capacity, drained GPUs). */
export function plainError(err: unknown): string {
  if (!(err instanceof ApiError)) {
    return `The request failed: ${String((err as Error)?.message ?? err)}`;
  }
  switch (err.status) {
    case 403:
      return `Your quota does not allow this: ${err.message}`;
    case 409:
      return `Not possible right now: ${err.message}`;
    case 503:
      return `The GPUs for this are drained for maintenance: ${err.message}`;
    case 404:
      return `Not found: ${err.message}`;
    default:
      return err.message;
  }
}
