"""The torchao entry point: quantize_(model, FourOverSixTrainingConfig(...)) on a plain PyTorch model (no
torchtitan), on CPU: it swaps exactly the filtered nn.Linear layers, keeps the state_dict, and trains."""

import pytest
import torch
from torch import nn
from torchao.quantization import quantize_

from titan_fp4six import FourOverSixLinear, FourOverSixRecipe, FourOverSixTrainingConfig, quantizable_linear


class Net(nn.Module):
    """A small MLP classifier; the 10-way head (out_features 10) cannot be NVFP4-quantized."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.body(x))


def _data(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    return x, (x[:, :10] * torch.arange(1, 11)).argmax(dim=1)  # a learnable target


def test_quantize_swaps_the_filtered_linears_and_keeps_the_state_dict():
    torch.manual_seed(0)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = FourOverSixTrainingConfig(activation_scaling="row", weight_block="1x16", backward="high_precision")
    quantize_(model, config, filter_fn=lambda mod, fqn: isinstance(mod, nn.Linear) and fqn != "head")
    assert [type(m) for m in model.body] == [FourOverSixLinear, nn.GELU, FourOverSixLinear, nn.GELU]
    assert type(model.head) is nn.Linear
    assert model.body[0].recipe == FourOverSixRecipe(activation_scaling="row", weight_block="1x16",
                                                     backward="high_precision")
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())


def test_bad_dims_and_bad_knobs_are_clear_errors():
    with pytest.raises(ValueError, match=r"in_features=64, out_features=10.*multiples of 16.*filter_fn"):
        quantize_(Net(), FourOverSixTrainingConfig())  # torchao's default filter takes every Linear
    model = Net()
    quantize_(model, FourOverSixTrainingConfig(), filter_fn=quantizable_linear)
    assert type(model.body[2]) is FourOverSixLinear and type(model.head) is nn.Linear
    with pytest.raises(ValueError, match=r"FourOverSixTrainingConfig: .*scale_bound=300"):
        FourOverSixTrainingConfig(scale_bound=300)


def test_a_second_quantize_with_another_config_is_an_error():
    """The handler leaves converted Linears alone: the same config again is a no-op, another one would be
    silently ignored (scale_bound stayed 256), so it is refused with both recipes named."""
    model = Net()
    quantize_(model, FourOverSixTrainingConfig(), filter_fn=quantizable_linear)
    first = model.body[0]
    quantize_(model, FourOverSixTrainingConfig(), filter_fn=quantizable_linear)
    assert model.body[0] is first
    with pytest.raises(ValueError, match=r"already a FourOverSixLinear with recipe=.*scale_bound=256.*asks for "
                                         r"recipe=.*scale_bound=448"):
        quantize_(model, FourOverSixTrainingConfig(scale_bound=448), filter_fn=quantizable_linear)
    with pytest.raises(ValueError, match=r"cache_weights=False; the new config asks for .*cache_weights=True"):
        quantize_(model, FourOverSixTrainingConfig(cache_weights=True), filter_fn=quantizable_linear)
    assert model.body[0].recipe.scale_bound == 256


def test_trains_a_plain_model_and_bf16_state_loads_back():
    torch.manual_seed(0)
    model = Net().to(torch.bfloat16)
    quantize_(model, FourOverSixTrainingConfig(), filter_fn=quantizable_linear)
    x, y = _data()
    x = x.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(map(torch.isfinite, map(torch.tensor, losses)))
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5, losses
    # the trained weights load into an unconverted bf16 model, and its bf16 state back into a converted one
    plain = Net().to(torch.bfloat16)
    plain.load_state_dict(model.state_dict())
    converted = Net().to(torch.bfloat16)
    quantize_(converted, FourOverSixTrainingConfig(), filter_fn=quantizable_linear)
    converted.load_state_dict(plain.state_dict())
    with torch.no_grad():
        assert torch.equal(converted(x), model(x))
        plain_loss = nn.functional.cross_entropy(plain(x).float(), y).item()
    assert plain_loss < 0.6 * sum(losses[:5]) / 5  # the quantized training taught the unquantized model too


def test_cache_weights_with_a_hook_after_each_optimizer_step():
    """cache_weights outside torchtitan: the caller invalidates after each step (here an optimizer post hook);
    two micro-batches per step train exactly as without the cache."""
    from titan_fp4six.modules import invalidate_weight_caches

    with pytest.raises(ValueError, match="cache_weights=1; it must be True or False"):
        FourOverSixTrainingConfig(cache_weights=1)
    x, y = _data()
    losses = {}
    for cache in (False, True):
        torch.manual_seed(0)
        model = Net()
        quantize_(model, FourOverSixTrainingConfig(cache_weights=cache), filter_fn=quantizable_linear)
        assert (model.body[0].weight_cache is not None) == cache
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)  # fused: no version counter bumps
        opt.register_step_post_hook(lambda *_: invalidate_weight_caches(model))
        losses[cache] = []
        for _ in range(4):
            for xb, yb in ((x[:128], y[:128]), (x[128:], y[128:])):
                loss = nn.functional.cross_entropy(model(xb), yb)
                loss.backward()
                losses[cache].append(loss.item())
            opt.step()
            opt.zero_grad()
    assert losses[True] == losses[False]
    assert model.body[0].weight_cache.quantizations == 4


def test_a_linear_used_twice_is_converted_everywhere():
    lin = nn.Linear(64, 64)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    quantize_(model, FourOverSixTrainingConfig())
    assert [type(m).__name__ for m in model] == ["FourOverSixLinear", "ReLU", "FourOverSixLinear"]
    assert model[0] is model[2]
