"""Whether the allocator answers this server, told once per change: a hub whose allocator is down
keeps working, with one line in each server's log when it goes away and one when it is back."""

from __future__ import annotations

import logging


class Availability:
    """The allocator as this server's periodic work (reports, event relay, job runner) last found it."""

    def __init__(self, url: str, log: logging.Logger):
        self.url = url
        self.log = log
        self.down: str | None = None  # why it did not answer, while it does not

    def failed(self, error: BaseException) -> None:
        """A call failed: the first failure in a row is logged, the retries are quiet."""
        if self.down is None:
            self.log.warning("gpualloc: the GPU allocator at %s does not answer (%s); kernels start without "
                             "GPU slices, and this server keeps trying quietly", self.url, error)
        self.down = str(error)

    def answered(self) -> None:
        if self.down is not None:
            self.log.info("gpualloc: the GPU allocator at %s answers again", self.url)
        self.down = None
