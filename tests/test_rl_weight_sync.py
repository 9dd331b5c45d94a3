"""rl/weight_sync.py on 2 gloo ranks: a trainer model sharded by FSDP2 (experts sharded over experts, Shard(0), or
over their rows, Shard(1), as torchtitan does when FSDP x EP exceeds the experts) copied into a whole engine model
on every rank. Packed: each engine's installed QuantizedWeights are bitwise the whole weights' quantization (codes,
scales, decode, amaxes, source), for FP32 and bf16 operands; the rest is the trainer's tensors; bf16: everything."""

import pytest
import torch

from tests.helpers.gloo import run_ranks
from tests.helpers.training_harness import REPO

RECIPE = str(REPO / "configs" / "rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml")


def _job():
    from torchtitan.config.manager import ConfigManager

    return ConfigManager().parse_args(["--job.config_file", RECIPE, "--model.flavor", "tiny"])


def _rank(rank: int, port: int, placement: int, mode: str, dtype: torch.dtype, queue) -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from titan_fp4six.ops import quantize_grouped_weight
    from titan_fp4six.rl.experts import ExpertWeightCache, is_quantized, rollout_recipe
    from titan_fp4six.rl.trainer import build_converted
    from titan_fp4six.rl.weight_sync import WeightSync

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        job = _job()
        torch.manual_seed(0)
        trainer = build_converted(job, "cpu", torch.float32)
        with torch.no_grad():  # the same weights on both ranks, of every scale, so the experts' amaxes differ
            trainer.init_weights()
            for i, p in enumerate(trainer.parameters()):
                p.copy_(torch.randn(p.shape) * (1 + i % 7))
        whole = {n: t.clone() for n, t in trainer.state_dict().items()}
        mesh = dist.device_mesh.init_device_mesh("cpu", (2,))
        for layer in trainer.layers.values():
            if getattr(layer, "moe_enabled", False):
                fully_shard(layer.moe.experts, mesh=mesh, shard_placement_fn=lambda p: Shard(placement))
            fully_shard(layer, mesh=mesh)
        fully_shard(trainer, mesh=mesh)
        torch.manual_seed(1)
        engine = build_converted(job, "cpu", dtype)
        cache = ExpertWeightCache()
        stats = WeightSync(engine, cache, mode, dtype)(trainer)
        checked = mismatched = 0
        for name, m in engine.named_modules():
            if not is_quantized(m):
                continue
            served = cache.quantized(m, [])
            if mode == "bf16":
                assert cache._installed.get(m) is None
                continue
            for w, qw in zip(("w1", "w2", "w3"), served):
                want = quantize_grouped_weight(whole[f"{name}.{w}"].to(dtype).transpose(-2, -1),
                                               recipe=rollout_recipe(m.recipe))
                same = (torch.equal(qw.codes, want.codes) and torch.equal(qw.amax, want.amax)
                        and torch.equal(qw.scales.view(torch.uint8), want.scales.view(torch.uint8))
                        and torch.equal(qw.decoded, want.decoded) and qw.source == want.source)
                checked += 1
                mismatched += not same
        engine_state = engine.state_dict()
        copied = [n for n in whole if ".experts." not in n or mode == "bf16"]
        unequal = [n for n in copied if not torch.equal(engine_state[n], whole[n].to(dtype))]
        queue.put((rank, (checked, mismatched, unequal, stats)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("placement, mode, dtype", [(0, "packed", torch.float32), (1, "packed", torch.float32),
                                                    (0, "packed", torch.bfloat16), (1, "bf16", torch.float32)])
def test_the_engine_holds_the_trainers_weights(placement, mode, dtype):
    for rank, (checked, mismatched, unequal, stats) in enumerate(run_ranks(_rank, 2, placement, mode, dtype)):
        assert unequal == [], (rank, unequal)
        if mode == "packed":
            assert checked > 0 and mismatched == 0, (rank, checked, mismatched)
            # codes K/2 + scales K/16 bytes a row against 2K, plus 4 bytes of amax an expert
            assert 0.28125 < stats.packed / stats.packed_bf16 < 0.285, stats
        else:
            assert checked == 0 and stats.packed == 0 and stats.whole > 0


def _placements_rank(rank: int, port: int, queue) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    from titan_fp4six.ops import FourOverSixRecipe, quantize_grouped_weight
    from titan_fp4six.rl.weight_sync import packed_expert_weight

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    try:
        recipe = FourOverSixRecipe(err_mode="mse", scale_bound=256, weight_block="1x16", activation_scaling="row",
                                   backward="high_precision", gemm="emulated")
        flat = dist.device_mesh.init_device_mesh("cpu", (4,))
        grid = dist.device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("efsdp", "ep"))
        cases = {"uneven experts (one rank empty)": (6, flat, [Shard(0)]),
                 "rows over 4": (4, flat, [Shard(1)]),
                 "EP x FSDP strided (efsdp 2)": (8, grid, [_StridedShard(0, split_factor=2), Shard(0)]),
                 "EP x FSDP on rows": (4, grid, [Shard(1), Shard(0)])}
        out = {}
        for name, (experts, mesh, placements) in cases.items():
            torch.manual_seed(0)
            whole = torch.randn(experts, 64, 32) * torch.arange(1, experts + 1)[:, None, None]
            w = distribute_tensor(whole, mesh, placements)
            qw, _ = packed_expert_weight(w, torch.bfloat16, recipe)
            want = quantize_grouped_weight(whole.to(torch.bfloat16).transpose(-2, -1), recipe=recipe)
            out[name] = (torch.equal(qw.codes, want.codes) and torch.equal(qw.amax, want.amax)
                         and torch.equal(qw.scales.view(torch.uint8), want.scales.view(torch.uint8))
                         and torch.equal(qw.decoded, want.decoded))
        queue.put((rank, out))
    finally:
        dist.destroy_process_group()


def test_packed_weights_assemble_from_every_expert_layout():
    """4 gloo ranks: experts split unevenly (a rank with none), rows split, and expert parallelism's 2-D layouts
    (FSDP2's strided shard of the experts over efsdp x ep, or rows over efsdp): each rank's packed weight is
    bitwise the whole weight's quantization."""
    for rank, out in enumerate(run_ranks(_placements_rank, 4)):
        assert all(out.values()), (rank, out)
