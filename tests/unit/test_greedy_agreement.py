"""The shared near-tie rule (tests/greedy_agreement.py) passes what it should and fails what it should."""

from __future__ import annotations

import numpy as np
import pytest

from tests.greedy_agreement import assert_greedy_agree, assert_text_agrees, bf16_ulp, first_difference


def rows(top: float, gap: float, n: int = 3) -> list[np.ndarray]:
    """n logits rows over 4 tokens: token 1 on top at `top`, token 2 `gap` below it."""
    row = np.array([0.0, top, top - gap, -5.0], dtype=np.float32)
    return [row] * n


def test_bf16_ulp_and_first_difference() -> None:
    assert bf16_ulp(26.0) == 0.125 and bf16_ulp(-16.0) == 0.125 and bf16_ulp(15.9) == 0.0625
    assert first_difference((1, 2, 3), (1, 2, 3)) is None
    assert first_difference((1, 2, 3), (1, 5, 3)) == 1 and first_difference((1, 2), (1, 2, 3)) == 2


def test_equal_replies_and_near_ties_pass_real_differences_fail() -> None:
    assert_greedy_agree((1, 1, 1), (1, 1, 1), rows(26.0, 3.0))
    assert_greedy_agree((1, 1, 1), (1, 2, 0), rows(26.0, 0.5))  # 4 ulps of 0.125
    with pytest.raises(AssertionError, match="a real bug"):
        assert_greedy_agree((1, 1, 1), (1, 2, 0), rows(26.0, 0.625))
    with pytest.raises(AssertionError, match="a real bug"):  # the reference did not even prefer its own token
        assert_greedy_agree((2, 1, 1), (1, 1, 1), rows(26.0, 0.125))
    with pytest.raises(AssertionError, match="prefix"):
        assert_greedy_agree((1, 1, 1), (1, 1), rows(26.0, 0.0))


def test_text_replies_use_the_same_rule() -> None:
    text = {0: b"a", 1: b"b", 2: b"c", 3: b"d"}

    def token_bytes(ids):
        return b"".join(text[i] for i in ids)

    assert_text_agrees((1, 1, 1), rows(26.0, 3.0), token_bytes, "bbb")
    assert_text_agrees((1, 1, 1), rows(26.0, 0.25), token_bytes, "bcd")
    with pytest.raises(AssertionError, match="no near-tie"):
        assert_text_agrees((1, 1, 1), rows(26.0, 1.0), token_bytes, "bcd")


def test_same_up_to_rounding_allows_one_rounding_and_no_more() -> None:
    import torch

    from tests.greedy_agreement import assert_same_up_to_rounding

    want = torch.tensor([[20.0, -3.0, 0.5, 17.0]]).bfloat16()  # row max 20: one bf16 ulp is 0.125
    assert_same_up_to_rounding(want + torch.tensor([[0.125, 0.125, -0.125, 0.0]]).bfloat16(), want, 1)
    with pytest.raises(AssertionError, match="ulps"):
        assert_same_up_to_rounding(want + torch.tensor([[0.0, 0.25, 0.0, 0.0]]).bfloat16(), want, 1)


def test_argmax_agreement_counts_near_ties_and_fails_a_clear_winner() -> None:
    from tests.greedy_agreement import CROSS_TIE, assert_argmax_agree, pair_margin

    ref = np.array([[0.0, 20.0, 19.6, 1.0], [0.0, 20.0, 10.0, 1.0], [5.0, 1.0, 0.0, 0.0]], dtype=np.float32)
    ours = ref.copy()
    assert assert_argmax_agree(ours, ref) == 0
    ours[0] = [0.0, 19.5, 19.7, 1.0]  # ours picks token 2 by 0.2, llama.cpp token 1 by 0.4: a near-tie
    assert pair_margin(ours[0], ref[0], 2, 1) == pytest.approx(0.6)
    assert assert_argmax_agree(ours, ref) == 1
    ours[1] = [0.0, 20.0, 20.2, 1.0]  # llama.cpp's token 1 leads by 10: a clear winner differs
    with pytest.raises(AssertionError, match="clear winner differs at 1 positions"):
        assert_argmax_agree(ours, ref)
    ours[1] = [0.0, 20.0, 20.0 + 10.0 + CROSS_TIE, 1.0]  # the margins add up: 10 + 11.5 is far past the tie
    with pytest.raises(AssertionError):
        assert_argmax_agree(ours, ref)


def test_backends_agree_by_the_pair_margin_in_either_order() -> None:
    from tests.greedy_agreement import assert_backends_agree

    row_a = np.array([[0.0, 10.0, 9.5]])  # backend A picks 1 by 0.5
    row_b = np.array([[0.0, 9.8, 10.0]])  # backend B picks 2 by 0.2
    logits = {"a": lambda ids: row_a, "b": lambda ids: row_b}
    assert_backends_agree((1, 1), (1, 1), (0,), logits)
    assert_backends_agree((1, 1), (2, 1), (0,), logits)
    assert_backends_agree((2, 1), (1, 1), (0,), {"b": lambda ids: row_b, "a": lambda ids: row_a})
    with pytest.raises(AssertionError, match="more than a near-tie"):
        assert_backends_agree((1, 1), (2, 1), (0,), logits, tie=0.5)
    with pytest.raises(AssertionError, match="prefix"):
        assert_backends_agree((1, 1), (1,), (0,), logits)
