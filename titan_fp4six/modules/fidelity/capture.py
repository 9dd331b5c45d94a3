"""FidelityCapture: the metrics of a model's converted modules, measured on the operands of a real forward and
backward (hooks), and the GemmCases of a Linear and of a routed-experts module."""

import torch
import torch.nn.functional as F
from torch import nn

from ..autocast import autocast_operands, no_autocast
from ..dtensor import local_weight
from ..experts import _FourOverSixExperts, ep_dispatched, pad_token_groups
from ..linear import FourOverSixLinear
from .gemm import gemm_fidelity, run_gemm
from .operands import GemmCase

_EXPERT_WEIGHTS = ("w1", "w3", "w2")  # forward order


def converted_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(fqn, module) of every four-over-six Linear and routed-experts module of `model`."""
    return [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, (FourOverSixLinear, _FourOverSixExperts))]

def _linear_cases(fqn: str, module: FourOverSixLinear, x: torch.Tensor, w_dtype, dy) -> list[GemmCase]:
    w = local_weight(module.weight, "weight").detach().to(w_dtype)
    return [GemmCase(fqn, x, w, dy.reshape(-1, w.shape[0]).to(x.dtype), module.recipe)]

def _expert_cases(fqn: str, module: _FourOverSixExperts, x: torch.Tensor, num_tokens_per_expert, w_dtype,
                  dy) -> list[GemmCase]:
    """w1, w3 and w2 of the gated chain in the module's token-group layout, their inner operands and gradients
    from the unquantized chain for the module's output gradient."""
    w = {n: local_weight(getattr(module, n), n, experts=True).detach().to(w_dtype) for n in _EXPERT_WEIGHTS}
    dy = dy.to(x.dtype)
    if ep_dispatched(module):
        sizes, dest = num_tokens_per_expert, None
    else:
        x, sizes, dest = pad_token_groups(x, num_tokens_per_expert, module.pad_multiple)
        dy = dy.new_zeros(x.shape[0], dy.shape[1]).index_copy(0, dest, dy)
    offs = torch.cumsum(sizes, 0, dtype=torch.int32)
    rows = int(offs[-1])
    x, dy = x[:rows], dy[:rows]
    h1, h3 = (run_gemm(x, w[n], offs, None).requires_grad_() for n in ("w1", "w3"))
    h = F.silu(h1) * h3
    d1, d3 = torch.autograd.grad(run_gemm(h, w["w2"], offs, None), (h1, h3), dy)
    return [GemmCase(f"{fqn}.w1", x, w["w1"], d1, module.recipe, offs, dest),
            GemmCase(f"{fqn}.w3", x, w["w3"], d3, module.recipe, offs, dest),
            GemmCase(f"{fqn}.w2", h.detach(), w["w2"], dy, module.recipe, offs, dest)]

class FidelityCapture:
    """Measures the GEMMs of `modules` ((fqn, converted module) pairs) in the forward and backward passes run
    while `active`: `take()` returns {gemm name: gemm_fidelity} in module order. A module is measured once per
    take (the first micro-batch; a forward without gradient is skipped). unquantized_forward: the modules
    compute what their unconverted parents compute (bf16 twin), so every captured input is the bf16 model's."""

    def __init__(self, modules: list[tuple[str, nn.Module]], *, unquantized_forward: bool = False):
        self.active = True
        self._modules = modules
        self._results: dict[str, dict[str, dict[str, float]]] = {}
        self._handles = [m.register_forward_hook(self._forward_hook(fqn)) for fqn, m in modules]
        self._unquantized = unquantized_forward
        for _, m in modules if unquantized_forward else ():
            m.forward = super(FourOverSixLinear if isinstance(m, FourOverSixLinear) else _FourOverSixExperts,
                              m).forward

    def _forward_hook(self, fqn: str):
        def hook(module, args, output):
            if not self.active or fqn in self._results or not output.requires_grad:
                return
            linear = isinstance(module, FourOverSixLinear)
            # the dtypes the converted forward hands the op (autocast's), x as (tokens, K)
            x, w = autocast_operands(args[0], module.weight if linear else module.w1)
            x, w_dtype, extra = x.detach().reshape(-1, x.shape[-1]), w.dtype, args[1:]

            def measure(dy):
                with torch.enable_grad(), no_autocast(dy.device):
                    cases = (_linear_cases if linear else _expert_cases)(fqn, module, x, *extra, w_dtype, dy)
                    self._results[fqn] = {c.name: gemm_fidelity(c) for c in cases}

            output.register_hook(measure)
        return hook

    def take(self) -> dict[str, dict[str, float]]:
        """The measured GEMMs' metrics in module order; the capture starts over."""
        results = [self._results.get(fqn, {}) for fqn, _ in self._modules]
        self._results = {}
        return {name: metrics for per_module in results for name, metrics in per_module.items()}

    def remove(self) -> None:
        """Drop the hooks (and the unquantized forwards)."""
        for handle in self._handles:
            handle.remove()
        for _, m in self._modules if self._unquantized else ():
            del m.forward

    def __enter__(self) -> "FidelityCapture":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
