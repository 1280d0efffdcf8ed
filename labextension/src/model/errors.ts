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

/** Why the panel has no fleet to show: GPU features off on this server (503, with what to set), or
 * the allocator not answering. */
export function unreachableText(err: unknown): string {
  const message = (err as Error)?.message ?? String(err);
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
