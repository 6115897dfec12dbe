"""lite/stops.py: a stop string ends the text and never shows, whole or in part, however the
pieces split it."""
import pytest

from lite.stops import StopMatcher


def feed(stops, pieces):
    m = StopMatcher(stops)
    out = []
    for p in pieces:
        text, stopped = m.push(p)
        out.append(text)
        if stopped:
            return "".join(out), m.stopped
    out.append(m.flush())
    return "".join(out), None


def every_split(text):
    """Every cut of text into up to three pieces, and the one into single characters."""
    n = len(text)
    yield list(text)
    for i in range(n + 1):
        for j in range(i, n + 1):
            yield [p for p in (text[:i], text[i:j], text[j:]) if p]


@pytest.mark.parametrize("text,stops,want", [
    ("Hello world<|end|>junk", ["<|end|>"], "Hello world"),
    ("abc", ["x"], "abc"),
    ("a<b<c", ["<c"], "a<b"),
    ("one\n\ntwo", ["\n\n", "two"], "one"),
    ("User: hi", ["User:"], ""),
    ("ends with a partial <|en", ["<|end|>"], "ends with a partial <|en"),
])
def test_no_split_leaks_the_stop_string(text, stops, want):
    for pieces in every_split(text):
        got, _ = feed(stops, pieces)
        assert got == want, pieces


def test_the_earliest_stop_wins_and_is_reported():
    got, which = feed(["world", "lo w"], ["Hel", "lo wor", "ld"])
    assert got == "Hel" and which == "lo w"


def test_held_text_is_released_when_it_stops_being_a_prefix():
    m = StopMatcher(["</s>"])
    assert m.push("a</") == ("a", False)
    assert m.push("b") == ("</b", False)
    assert m.push("</s") == ("", False)
    assert m.push(">tail") == ("", True)
    assert m.push("more") == ("", True) and m.flush() == ""


def test_no_stop_strings_pass_everything_through():
    m = StopMatcher([])
    assert m.push("abc") == ("abc", False) and m.flush() == ""
    assert StopMatcher(["", ""]).push("x") == ("x", False)
