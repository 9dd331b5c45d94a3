"""scripts/rollout_distance.py's statistics and report on synthetic per-window distances (the study itself needs a
trained checkpoint: docs/fidelity.md), and its token-level distances against a hand computation."""

import math

import pytest
import torch

from scripts.rollout_distance import DATA, METRICS, VARIANTS, distances, summarize, table


def test_distances_are_kl_and_the_actual_tokens_logprob_gap():
    ref = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64))
    q = torch.log(torch.tensor([[0.25, 0.75], [0.9, 0.1]], dtype=torch.float64))
    d = distances(ref, q, [0, 1, 0], first=0)
    assert d["kl"][0] == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)) and d["kl"][1] == 0
    assert d["dlogp"] == pytest.approx([abs(math.log(0.5) - math.log(0.75)), 0.0])
    assert distances(ref, q, [0, 1, 0], first=1)["kl"] == [0.0]


def test_summary_pairs_the_variants_by_window():
    g = torch.Generator().manual_seed(0)
    per = {}
    for name in VARIANTS:
        scale = 0.9 if name.startswith("4/6") else 1.0
        per[name] = [{"kl": (scale * (1 + 0.1 * torch.rand(5, generator=g))).tolist(), "dlogp": [0.1] * 5}
                     for _ in range(12)]
    s = summarize(per, "kl")
    pair = s["pairs"]["row"]
    assert pair["difference"]["high"] < 0 and 0.85 < pair["ratio"]["value"] < 0.95 and pair["ratio"]["bounded"]
    assert s["variants"]["NVFP4, tensor"]["n"] == 12
    text = "\n".join(table({d: {m: summarize(per, m) for m in METRICS} for d in DATA}, verdicts=False))
    assert text.count("| tensor |") == 4 and "4/6 / NVFP4" in text
