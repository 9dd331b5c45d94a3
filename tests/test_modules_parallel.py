"""The modules under FSDP2 and expert parallelism (DTensor weights), on a one-rank gloo group on the CPU."""

import copy
import socket

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch import nn
from torchtitan.models.moe.moe import GroupedExperts

from titan_fp4six.modules import FourOverSixLinear, convert_experts
from titan_fp4six.modules.experts import run_experts
from titan_fp4six.ops import FourOverSixRecipe

RECIPE = FourOverSixRecipe()


@pytest.fixture(scope="module")
def one_rank():
    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class _Recording(FourOverSixLinear):
    seen: list

    def forward(self, x):
        self.seen.append(type(self.weight))
        return super().forward(x)


def test_fsdp2_hands_plain_weights_and_matches_unsharded(one_rank):
    torch.manual_seed(0)
    lin = nn.Linear(64, 32, bias=False)
    ref = FourOverSixLinear.from_linear(nn.Linear(64, 32, bias=False), RECIPE)
    ref.weight = nn.Parameter(lin.weight.detach().to(torch.bfloat16).clone())
    m = _Recording.from_linear(lin, RECIPE)
    m.seen = []
    fully_shard(m, mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",)),
                mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    y = m(x)
    assert m.seen == [nn.Parameter]  # FSDP2's unsharded parameter is a plain tensor: quantized whole
    assert torch.equal(y, ref(x))
    y.float().sum().backward()
    assert m.weight.grad is not None


def test_expert_parallel_dtensor_weights_use_the_dispatched_buffer(one_rank):
    torch.manual_seed(0)
    e = GroupedExperts(64, 32, 4, use_grouped_mm=True)
    with torch.no_grad():
        e.init_weights(0.1)
    plain = [p.detach().clone() for p in (e.w1, e.w2, e.w3)]
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("ep",))
    for n in ("w1", "w2", "w3"):
        e.register_parameter(n, nn.Parameter(distribute_tensor(getattr(e, n).detach(), mesh, [Shard(0)])))
    convert_experts(e, RECIPE)
    # padded dispatch output: groups already multiples of the alignment, plus an over-allocated tail
    counts = torch.tensor([16, 0, 32, 16], dtype=torch.int32)
    x = torch.cat([torch.randn(64, 64), torch.full((64, 64), 7.0)])
    out = e(x, counts)
    assert torch.equal(out, run_experts(*plain, x, counts, RECIPE))
    assert torch.equal(out[64:], torch.zeros(64, 64))
    out.sum().backward()
    assert e.w1.grad is not None and e.w1.grad.placements == (Shard(0),)


def test_tensor_parallel_weights_are_refused(one_rank):
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    e = GroupedExperts(64, 32, 4, use_grouped_mm=True)
    with torch.no_grad():
        e.init_weights(0.1)
    e.register_parameter("w1", nn.Parameter(distribute_tensor(e.w1.detach(), mesh, [Shard(1)])))
    convert_experts(e, RECIPE)
    with pytest.raises(NotImplementedError, match="tensor_parallel_degree"):
        e(torch.randn(16, 64), torch.tensor([16, 0, 0, 0]))
    lin = FourOverSixLinear.from_linear(nn.Linear(64, 32), RECIPE)
    lin.weight = nn.Parameter(distribute_tensor(lin.weight.detach(), mesh, [Shard(0)]))
    with pytest.raises(NotImplementedError, match="Replicate"):
        lin(torch.randn(4, 64))
    lin.weight = nn.Parameter(distribute_tensor(lin.weight.detach().full_tensor(), mesh, [Replicate()]))
    lin.bias = nn.Parameter(lin.bias.detach())
    assert lin(torch.randn(4, 64)).shape == (4, 32)


def test_fsdp2_weight_cache_hits_across_micro_batches_and_matches(one_rank):
    """Under FSDP2 the module sees the unsharded parameter, which FSDP2 refills on every all-gather (version
    counter preserved): the cache hits on the step's later micro-batches and the optimizer-step invalidation is
    what brings the new values in. Outputs and gradients equal the uncached module's."""
    from titan_fp4six.modules import invalidate_weight_caches

    torch.manual_seed(0)
    lin = nn.Linear(64, 32, bias=False)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
    models = []
    for cache in (False, True):
        outer = nn.Sequential(FourOverSixLinear.from_linear(copy.deepcopy(lin), RECIPE, cache_weights=cache))
        fully_shard(outer[0], mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
        fully_shard(outer, mesh=mesh)
        models.append((outer, torch.optim.AdamW(outer.parameters(), lr=1e-2)))
    for step in range(3):
        xs = [torch.randn(16, 64) for _ in range(2)]
        outs = []
        for model, opt in models:
            outs.append([])
            for x in xs:
                y = model(x)
                y.float().square().mean().backward()
                outs[-1].append(y.detach())
            opt.step()
            opt.zero_grad()
            invalidate_weight_caches(model)
        assert all(torch.equal(a, b) for a, b in zip(*outs))
    assert models[1][0][0].weight_cache.quantizations == 3  # once per step
