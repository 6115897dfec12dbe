"""Stop strings over streamed text, for the server (the same interface as lite/stops.py's
StopMatcher, which replaces this file once both are in one tree).

A stop string may arrive split across tokens, so the end of the text that could begin one is held
back until the next piece settles it: no part of a stop string is ever sent.
"""


class StopMatcher:
    def __init__(self, stops=()):
        self.stops = [s for s in dict.fromkeys(stops) if s]
        self._held = ""
        self.stopped = None        # the stop string that ended the text, once one has

    def push(self, piece):
        """Add a piece; returns (text safe to send now, whether a stop string was found)."""
        if self.stopped is not None:
            return "", True
        buf = self._held + piece
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            at, self.stopped = min(hits)
            self._held = ""
            return buf[:at], True
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(buf)), 0, -1)
                    if buf.endswith(s[:n])), default=0)
        self._held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep], False

    def flush(self):
        """The text held back, when the stream ends without a stop string."""
        out, self._held = self._held, ""
        return "" if self.stopped is not None else out
