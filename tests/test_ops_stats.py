"""The map-to-4 accumulator the ops feed from their forward quantizations."""

import pytest
import torch

from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_mm
from titan_fp4six.quant import four_over_six_quantize, group_amax, tensor_amax
from titan_fp4six.quant.process_state import MAP4_STATS, Map4Stats


def test_counts_per_device_while_enabled_and_resets():
    stats = Map4Stats()
    assert stats.read_and_reset() is None
    counts = stats.counts(torch.device("cpu"))
    assert counts.dtype == torch.int64 and not counts.any()
    counts[0, :2].add_(torch.tensor([3, 8]))
    assert stats.counts(torch.device("cpu")) is counts  # one running count per device
    stats.counts(torch.device("cpu"))[5, :2].add_(torch.tensor([1, 2]))  # the kernels' programs spread over rows
    assert stats.read_and_reset() == 4 / 10
    assert stats.read_and_reset() is None
    stats.enabled = False
    assert stats.counts(torch.device("cpu")) is False  # the quantizers then neither count nor write a mask
    assert stats.read_and_reset() is None


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


@pytest.mark.parametrize("device", DEVICES)
def test_dense_forward_feeds_activation_and_weight_blocks(device):
    """The ops' counts (the kernel's own on CUDA, the reference's elsewhere) equal the public quantizers' masks."""
    x, w = torch.randn(32, 64, device=device), torch.randn(48, 64, device=device)
    MAP4_STATS.read_and_reset()
    four_over_six_mm(x, w, recipe=FourOverSixRecipe())
    mx = four_over_six_quantize(x, tensor_amax(x)).map4
    mw = four_over_six_quantize(w, tensor_amax(w), block="16x16").map4
    expected = (mx.sum() + mw.sum()).item() / (mx.numel() + mw.numel())
    assert 0 < expected < 1
    assert MAP4_STATS.read_and_reset() == expected


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_forward_skips_tail_rows(device):
    A, W = torch.randn(40, 64, device=device), torch.randn(2, 32, 64, device=device)
    A[30:] = float("nan")  # not tokens
    offs = torch.tensor([12, 30], dtype=torch.int32, device=device)
    MAP4_STATS.read_and_reset()
    four_over_six_grouped_mm(A, W.transpose(-2, -1), offs, recipe=FourOverSixRecipe())
    amax_rows = group_amax(A, offs).repeat_interleave(torch.tensor([12, 18], device=device))
    ma = four_over_six_quantize(A[:30], amax_rows).map4
    mw = torch.cat([four_over_six_quantize(W[e], tensor_amax(W[e]), block="16x16").map4 for e in range(2)])
    assert MAP4_STATS.read_and_reset() == (ma.sum() + mw.sum()).item() / (ma.numel() + mw.numel())


def test_nothing_counted_while_disabled(monkeypatch):
    monkeypatch.setattr(MAP4_STATS, "enabled", False)
    MAP4_STATS.read_and_reset()
    four_over_six_mm(torch.randn(16, 32), torch.randn(16, 32), recipe=FourOverSixRecipe())
    assert MAP4_STATS.read_and_reset() is None
