/** Why the sidebar's Request button cannot be used now, or '' when it can. */
export function requestHint(
  notebookPath: string | null,
  kernelId: string | null,
  held: boolean,
  refusedHolders: Record<string, string>
): string {
  if (refusedHolders.kernel) {
    return refusedHolders.kernel;
  }
  if (notebookPath === null) {
    return 'Open a notebook to request a slice for its kernel.';
  }
  if (!kernelId) {
    return `${notebookPath} has no running kernel.`;
  }
  if (held) {
    return `The kernel of ${notebookPath} already has a slice or a request.`;
  }
  return '';
}
