"""Choosing and ending the text: sampling (greedy, temperature, top-k, top-p, min-p, repetition
penalty, seeds) and lite/engine/sampling.py's StopMatcher, where a stop string ends the text and
never shows, whole or in part, however the pieces split it."""
import numpy as np
import pytest

from lite.engine import sampling
from lite.engine.sampling import Sampler, SamplingParams
from lite.engine.sampling import StopMatcher


def logits_from_probs(p):
    return np.log(np.asarray(p, dtype=np.float64)).astype(np.float32)


def draws(params, logits, n=2000, history=()):
    s = Sampler(params)
    return np.array([s(logits, history) for _ in range(n)])


def test_greedy_is_argmax():
    lg = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert Sampler(SamplingParams.greedy())(lg) == 1


def test_same_seed_same_draws_different_seed_differs():
    lg = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    p = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = draws(SamplingParams(seed=7, **p), lg, 200)
    b = draws(SamplingParams(seed=7, **p), lg, 200)
    c = draws(SamplingParams(seed=8, **p), lg, 200)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_temperature_one_follows_the_distribution():
    probs = [0.5, 0.3, 0.2]
    d = draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1),
              logits_from_probs(probs), 6000)
    freq = np.bincount(d, minlength=3) / d.size
    np.testing.assert_allclose(freq, probs, atol=0.03)


def test_top_k_keeps_only_k():
    lg = logits_from_probs([0.4, 0.3, 0.2, 0.1])
    d = draws(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=2), lg)
    assert set(d) == {0, 1}


def test_top_p_cuts_the_tail():
    lg = logits_from_probs([0.5, 0.3, 0.15, 0.05])
    # cumulative 0.5, 0.8, 0.95: top_p 0.75 keeps the first two
    d = draws(SamplingParams(temperature=1.0, top_k=0, top_p=0.75, min_p=0.0, seed=3), lg)
    assert set(d) == {0, 1}


def test_min_p_relative_to_the_best():
    lg = logits_from_probs([0.6, 0.3, 0.05, 0.05])
    # min_p 0.2 keeps tokens with p >= 0.12
    d = draws(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=4), lg)
    assert set(d) == {0, 1}


def test_low_temperature_sharpens():
    lg = logits_from_probs([0.4, 0.35, 0.25])
    d = draws(SamplingParams(temperature=0.05, top_k=0, top_p=1.0, min_p=0.0, seed=5), lg, 500)
    assert (d == 0).mean() > 0.9


def test_repeat_penalty_demotes_recent_tokens():
    lg = np.array([2.0, 1.9, -1.0], np.float32)
    greedy = Sampler(SamplingParams(temperature=0.0, repeat_penalty=1.5))
    assert greedy(lg, history=[]) == 0
    assert greedy(lg, history=[0]) == 1          # 2.0 / 1.5 < 1.9
    lg2 = np.array([-1.0, -1.2, -5.0], np.float32)
    assert greedy(lg2, history=[0]) == 1         # negative logits are multiplied: -1.5 < -1.2


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(min_p=2.0), dict(repeat_penalty=0)])
def test_bad_parameters(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


# --- lite/engine/sampling.py's StopMatcher: stop strings ---

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


# --- the top-k pre-selection (lite/engine/sampling.py top_k_sorted) --------------------------------------
def _partitioned(logits, k):
    """The candidates as the sampler took them before the pre-selection: a partition of the whole
    vocabulary, then a stable sort by logit."""
    idx = np.argpartition(-logits, k - 1)[:k]
    return idx[np.argsort(-logits[idx], kind="stable")]


def _vocab_logits(seed, n=128256):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 3).astype(np.float32)


@pytest.mark.parametrize("k", [1, 2, 40, 200])
def test_top_k_preselection_equals_the_full_partition(k):
    for seed in range(5):
        lg = _vocab_logits(seed)
        got = sampling.top_k_sorted(lg, k)
        assert got is not None and np.array_equal(got, _partitioned(lg, k))


@pytest.mark.parametrize("tie", ["inside", "boundary", "flat", "masked"])
def test_top_k_preselection_gives_way_to_the_partition_where_logits_tie(tie):
    """Equal logits among the k + 1 largest: which comes first is the partition's, so no answer."""
    lg = _vocab_logits(7)
    order = np.argsort(-lg)
    if tie == "inside":
        lg[order[5]] = lg[order[3]]
    elif tie == "boundary":
        lg[order[40]] = lg[order[39]]
    elif tie == "flat":
        lg[:] = 1.0
    else:                                  # fewer finite logits than k
        lg[order[10:]] = -np.inf
    assert sampling.top_k_sorted(lg, 40) is None


def test_sampled_tokens_unchanged_and_the_vocabulary_not_partitioned(monkeypatch):
    """Default settings over a llama-3-sized vocabulary: the same draws as the full partition
    (top_k_sorted off), and no partition of the whole vocabulary on the way."""
    params = SamplingParams(seed=11, repeat_penalty=1.1)
    logits = [_vocab_logits(s) for s in range(20)]
    history = list(range(100, 200))
    s = Sampler(params)
    new = [s(lg, history) for lg in logits]
    sizes = []
    real = (np.argpartition, np.partition)
    monkeypatch.setattr(np, "argpartition", lambda a, *x, **kw: sizes.append(a.size) or real[0](a, *x, **kw))
    monkeypatch.setattr(np, "partition", lambda a, *x, **kw: sizes.append(a.size) or real[1](a, *x, **kw))
    s = Sampler(params)
    assert [s(lg, history) for lg in logits] == new
    assert sizes and max(sizes) < logits[0].size // 4
    monkeypatch.setattr(sampling, "top_k_sorted", lambda lg, k: None)
    s = Sampler(params)
    assert [s(lg, history) for lg in logits] == new
