"""Stop strings over streamed text: generation ends where one appears, and no part of it is shown.

A stop string may arrive split across tokens ("<|e" then "nd|>"), so text that could be the start
of a stop string is held back until the next piece settles it. Pure: no model, no engine.

    m = StopMatcher(["\\n\\n", "User:"])
    for piece in pieces:
        text, stopped = m.push(piece)
        emit(text)
        if stopped:
            break
    else:
        emit(m.flush())
"""


class StopMatcher:
    def __init__(self, stops=()):
        self.stops = [s for s in dict.fromkeys(stops) if s]   # order kept, empties dropped
        self._held = ""
        self.stopped = None        # the stop string that ended the text, once one has

    def push(self, piece):
        """Add a piece of text; returns (text safe to show now, whether a stop string was found).
        After a stop, the text after it is dropped and further pushes return ("", True)."""
        if self.stopped is not None:
            return "", True
        buf = self._held + piece
        if not self.stops:
            return buf, False
        hit = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (hit is None or i < hit[0]):
                hit = (i, s)
        if hit is not None:
            self._held = ""
            self.stopped = hit[1]
            return buf[:hit[0]], True
        keep = self._partial(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self):
        """The text held back, when the stream ends without a stop string."""
        out, self._held = self._held, ""
        return "" if self.stopped is not None else out

    def _partial(self, buf):
        """The length of the longest end of `buf` that begins some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
