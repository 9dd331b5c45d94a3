"""The map-to-4 accumulator the ops feed from their forward quantizations."""

import torch

from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_mm
from titan_fp4six.dispatch import four_over_six_quantize, group_amax, tensor_amax
from titan_fp4six.ops import MAP4_STATS, Map4Stats


def test_accumulates_on_device_and_resets():
    stats = Map4Stats()
    assert stats.read_and_reset() is None
    stats.add(torch.tensor([[True, False], [True, True]]))
    stats.add(torch.tensor([[False, False, True]]), torch.tensor([0]), 1)  # group 0 of 1: data
    stats.add(torch.tensor([[True, True]]), torch.tensor([1]), 1)  # past the last group: not counted
    assert all(isinstance(h, torch.Tensor) for h in stats._counts[torch.device("cpu")].hits)
    assert stats.read_and_reset() == 4 / 7
    assert stats.read_and_reset() is None


def test_pending_counts_fold_without_a_read():
    stats = Map4Stats()
    for _ in range(1000):
        stats.add(torch.tensor([[True, False, False]]))
        stats.add(torch.tensor([[True, True], [True, True]]), torch.tensor([1, 2]), 2)
    counts = stats._counts[torch.device("cpu")]
    assert len(counts.hits) < 64 and len(counts.device_totals) < 64
    assert stats.read_and_reset() == 3000 / 5000


def test_dense_forward_feeds_activation_and_weight_blocks():
    x, w = torch.randn(32, 64), torch.randn(48, 64)
    MAP4_STATS.read_and_reset()
    four_over_six_mm(x, w, recipe=FourOverSixRecipe())
    mx = four_over_six_quantize(x, tensor_amax(x)).map4
    mw = four_over_six_quantize(w, tensor_amax(w), block="16x16").map4
    expected = (mx.sum() + mw.sum()).item() / (mx.numel() + mw.numel())
    assert 0 < expected < 1
    assert MAP4_STATS.read_and_reset() == expected


def test_grouped_forward_skips_tail_rows():
    A, W = torch.randn(40, 64), torch.randn(2, 32, 64)
    offs = torch.tensor([12, 30], dtype=torch.int32)
    MAP4_STATS.read_and_reset()
    four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=FourOverSixRecipe())
    amax_rows = group_amax(A, offs).repeat_interleave(torch.tensor([12, 18]))
    ma = four_over_six_quantize(A[:30], amax_rows).map4
    mw = torch.cat([four_over_six_quantize(W[e], tensor_amax(W[e]), block="16x16").map4 for e in range(2)])
    assert MAP4_STATS.read_and_reset() == (ma.sum() + mw.sum()).item() / (ma.numel() + mw.numel())
