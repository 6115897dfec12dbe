"""A progress line on standard error for long work (loading weights, writing files).

Shown only when stderr is a terminal and the work has taken more than half a second, so that quick
loads, pipes and tests stay quiet; redraws at most ten times a second."""
import sys
import time


class Progress:
    def __init__(self, total, label, unit_scale=2**30, unit="GiB", stream=None):
        self.total, self.label = max(1, total), label
        self.scale, self.unit = unit_scale, unit
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.t0 = self.last = time.monotonic()
        self.shown = False
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, n):
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self.t0 > 0.5 and now - self.last > 0.1:
            self.last = now
            self.shown = True
            self.stream.write(f"\rlite: {self.label} {100 * self.done / self.total:3.0f}% "
                              f"({self.done / self.scale:.1f}/{self.total / self.scale:.1f} {self.unit})")
            self.stream.flush()

    def close(self):
        if self.shown:
            self.stream.write(f"\rlite: {self.label} done: {self.total / self.scale:.1f} {self.unit} "
                              f"in {time.monotonic() - self.t0:.1f} s\n")
            self.stream.flush()
