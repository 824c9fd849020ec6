"""Window/stride bookkeeping of app.perplexity: every token but the first is scored exactly once."""

import pytest

from app.perplexity import Window, plan_windows
from backends.errors import InvalidRequestError
from hwprobe.quality import delta_ppl_warning


def _scored(windows):
    return [p for w in windows for p in range(w.first_scored, w.end)]


def test_stride_equal_ctx_gives_consecutive_windows_scoring_all_but_their_first():
    ws = plan_windows(10, 4, 4)
    assert ws == [Window(0, 4, 1), Window(4, 8, 5), Window(8, 10, 9)]


def test_stride_below_ctx_scores_each_token_once_with_overlap_as_context():
    ws = plan_windows(10, 4, 2)
    assert ws == [Window(0, 4, 1), Window(2, 6, 4), Window(4, 8, 6), Window(6, 10, 8)]
    assert _scored(ws) == list(range(1, 10))


def test_text_shorter_than_ctx_is_one_window():
    assert plan_windows(5, 512, 512) == [Window(0, 5, 1)]


@pytest.mark.parametrize("n,ctx,stride", [(100, 16, 5), (101, 7, 1), (33, 32, 31), (100, 16, 15)])
def test_overlapping_windows_score_every_token_after_the_first_exactly_once(n, ctx, stride):
    ws = plan_windows(n, ctx, stride)
    assert _scored(ws) == list(range(1, n))
    assert all(w.end - w.start <= ctx for w in ws)


def test_consecutive_windows_skip_only_their_first_tokens():
    ws = plan_windows(100, 16, 16)
    assert _scored(ws) == [p for p in range(100) if p % 16]


@pytest.mark.parametrize("n,ctx,stride", [(1, 16, 16), (10, 4, 5), (10, 4, 0), (10, 1, 1)])
def test_bad_windows_are_refused(n, ctx, stride):
    with pytest.raises(InvalidRequestError):
        plan_windows(n, ctx, stride)


def test_delta_ppl_rule_absolute_and_relative_limits():
    assert delta_ppl_warning(10.0, 10.4) is None  # 0.4 < 2 and 4% < 5%
    assert delta_ppl_warning(10.0, 10.6) is not None  # 6% of the base
    assert delta_ppl_warning(100.0, 102.5) is not None  # above 2 although only 2.5%
    assert delta_ppl_warning(10.0, 9.0) is None  # better is never a warning
