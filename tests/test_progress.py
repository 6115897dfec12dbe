"""The progress line: silent unless stderr is a terminal and the work is slow."""
import io

from lite.progress import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_silent_when_not_a_terminal():
    out = io.StringIO()
    p = Progress(100, "loading", stream=out)
    p.t0 -= 5
    p.update(50)
    p.close()
    assert out.getvalue() == ""


def test_shows_percent_and_total_on_a_slow_terminal():
    out = Tty()
    p = Progress(4 * 2**30, "loading weights", stream=out)
    p.t0 -= 5
    p.last -= 1
    p.update(2**30)
    p.close()
    text = out.getvalue()
    assert "loading weights  25% (1.0/4.0 GiB)" in text
    assert "done: 4.0 GiB in" in text and text.endswith("\n")


def test_quick_work_stays_quiet_even_on_a_terminal():
    out = Tty()
    p = Progress(100, "loading", stream=out)
    p.update(100)
    p.close()
    assert out.getvalue() == ""
