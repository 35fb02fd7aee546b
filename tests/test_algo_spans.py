"""Action spans and answer spans on hand-built token rows (ids and masks only)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from searchr1_lld.algo.spans import (
    action_span_list,
    action_spans,
    answer_span_list,
    answer_span_mask,
    answer_span_mask_list,
)

OPEN, CLOSE = 7, 8


def test_action_spans_hand_computed():
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 1]])
    expected = torch.tensor(
        [[0, 0, -1, 1, 1, -1], [-1, 0, 0, 0, -1, -1], [-1, -1, -1, -1, -1, -1], [0, -1, 1, -1, 2, 2]]
    )
    assert torch.equal(action_spans(mask), expected)
    assert torch.equal(action_spans(mask.bool()), expected)
    assert action_spans(mask).dtype == torch.long


def test_action_span_list_hand_computed():
    assert action_span_list([0, 1, 1, 0, 0, 1]) == [(1, 3), (5, 6)]
    assert action_span_list([]) == []
    assert action_span_list([0, 0]) == []
    assert action_span_list([1, 1, 1]) == [(0, 3)]
    with pytest.raises(ValueError):
        action_span_list([0, 2])


def test_action_spans_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        action_spans(torch.ones(4))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=12, max_size=12), min_size=1, max_size=5))
def test_tensor_and_list_spans_agree(rows):
    ids = action_spans(torch.tensor(rows))
    for r, row in enumerate(rows):
        expected = [-1] * len(row)
        for k, (s, e) in enumerate(action_span_list(row)):
            expected[s:e] = [k] * (e - s)
        assert ids[r].tolist() == expected


def test_answer_span_last_generated_pair():
    #        0  1     2  3      4  5     6  7      8
    ids = [1, OPEN, 2, CLOSE, 5, OPEN, 3, CLOSE, 9]
    mask = [1, 1, 1, 1, 0, 1, 1, 1, 0]
    assert answer_span_list(ids, mask, [OPEN], [CLOSE]) == (5, 8)
    assert answer_span_mask_list(ids, mask, [OPEN], [CLOSE]) == [0, 0, 0, 0, 0, 1, 1, 1, 0]
    # the last pair contains an observation token -> fall back to the previous fully generated pair
    mask2 = [1, 1, 1, 1, 0, 0, 1, 1, 0]
    assert answer_span_mask_list(ids, mask2, [OPEN], [CLOSE]) == [0, 1, 1, 1, 0, 0, 0, 0, 0]


def test_answer_span_none_when_unclosed_or_absent():
    assert answer_span_mask_list([1, OPEN, 2, 3], [1, 1, 1, 1], [OPEN], [CLOSE]) == [0, 0, 0, 0]
    assert answer_span_mask_list([1, 2, 3], [1, 1, 1], [OPEN], [CLOSE]) == [0, 0, 0]
    assert answer_span_mask_list([], [], [OPEN], [CLOSE]) == []
    # close before any open does not count
    assert answer_span_mask_list([CLOSE, 1, OPEN], [1, 1, 1], [OPEN], [CLOSE]) == [0, 0, 0]


def test_answer_span_at_very_end_and_regex_pairing():
    ids = [3, 4, OPEN, 5, 6, CLOSE]
    assert answer_span_mask_list(ids, [1] * 6, [OPEN], [CLOSE]) == [0, 0, 1, 1, 1, 1]
    # like re.finditer("<answer>(.*?)</answer>"): an open inside an open pairs with the first close after the first open
    ids = [OPEN, 1, OPEN, 2, CLOSE]
    assert answer_span_mask_list(ids, [1] * 5, [OPEN], [CLOSE]) == [1, 1, 1, 1, 1]


def test_answer_span_multi_token_tags_and_variants():
    open_ids, close_ids = [50, 60, 70], [50, 61, 70]
    ids = [1, 50, 60, 70, 9, 9, 50, 61, 70, 2]
    assert answer_span_mask_list(ids, [1] * 10, open_ids, close_ids) == [0, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    # a partial tag match is not a tag
    assert answer_span_mask_list([50, 60, 1, 50, 61, 70], [1] * 6, open_ids, close_ids) == [0] * 6
    # alternative spellings of the open tag (BPE merges a leading space differently)
    ids = [1, 51, 60, 70, 9, 50, 61, 70]
    assert answer_span_mask_list(ids, [1] * 8, [open_ids, [51, 60, 70]], close_ids) == [0, 1, 1, 1, 1, 1, 1, 1]
    with pytest.raises(ValueError):
        answer_span_mask_list(ids, [1] * 8, [], close_ids)
    with pytest.raises(ValueError):
        answer_span_mask_list(ids, [1] * 7, open_ids, close_ids)


def test_answer_span_mask_tensor_with_padding():
    ids = torch.tensor([[1, OPEN, 2, CLOSE, 0, 0], [OPEN, 3, CLOSE, 4, OPEN, 5], [OPEN, 1, CLOSE, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]])
    expected = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    out = answer_span_mask(ids, mask, [OPEN], [CLOSE])
    assert torch.equal(out, expected)
    assert out.dtype == mask.dtype
    with pytest.raises(ValueError):
        answer_span_mask(ids, mask[:, :3], [OPEN], [CLOSE])
