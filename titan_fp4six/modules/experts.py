"""Routed experts whose three grouped GEMMs (w1, w3, w2; SiLU-gated) run the four-over-six grouped op.

`four_over_six_experts_class(parent)` builds, once per parent class, a subclass of that experts class
(torchtitan's `GroupedExperts` or a look-alike with `w1/w2/w3` of shape (E, out, in) and
`forward(x, num_tokens_per_expert)`). Converting swaps `__class__` in place, so parameters, hooks and
`init_weights` stay the parent's and the state_dict is unchanged; only `recipe` (a plain attribute) is added.
The subclass always takes the grouped path, including where the parent would loop over experts.

Token groups are aligned to `pad_multiple` rows (GROUP_ALIGN by default). Without expert parallelism this
module pads the groups itself; with it, the dispatcher already did (into an over-allocated buffer). Either way only the rows up to
offs[-1] reach the op, and the output is zero-extended back, so padding rows never reach an amax.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..numerics.formats import BLOCK_SIZE
from ..ops import FourOverSixRecipe, QuantizedWeight, four_over_six_grouped_mms, quantize_grouped_weight
from ..ops.checks import check_recipe
from .autocast import autocast_dtype, cast_operands, no_autocast
from .dtensor import is_dtensor, local_weight
from .weight_cache import WeightCache

GROUP_ALIGN = 128
"""Default rows per token-group alignment unit (`pad_multiple`; torchtitan's TOKEN_GROUP_ALIGN_SIZE_M is set to
it): a multiple of Blackwell's 128-row block-scale tiles."""


def check_pad_multiple(value, name: str = "pad_multiple") -> None:
    """Token groups are quantized in 16-row blocks along M (Blackwell's grouped GEMM needs group starts on them)."""
    if type(value) is not int or value <= 0 or value % BLOCK_SIZE:
        raise ValueError(f"{name}={value!r}; it must be a positive multiple of {BLOCK_SIZE} (default {GROUP_ALIGN})")


_NAMES = ("w1", "w2", "w3")
_NO_CACHE = (None, None, None)


def gated(mms):
    """The SiLU-gated experts' chain over the grouped GEMMs mms(names, A, offs) of A's rows with the experts'
    weights `names` (("w1", "w3"), then ("w2",)), a tuple of their outputs: chain(A, offs) = w2(silu(w1 A) * w3 A)
    by token groups offs (A's rows all tokens). w1 and w3 read the same A: one mms call quantizes it once."""
    def chain(A: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        gate, up = mms(("w1", "w3"), A, offs)
        return mms(("w2",), F.silu(gate) * up, offs)[0]
    return chain


def experts_forward(x: torch.Tensor, num_tokens_per_expert: torch.Tensor, chain, rows: int | None = None) -> torch.Tensor:
    """chain(A, offs) (gated(mms)) on expert-sorted rows; rows past the last group (padding tail) come back as
    zeros. `rows` is offs[-1] when the caller already knows it (saves a host sync)."""
    offs = torch.cumsum(num_tokens_per_expert, dim=0, dtype=torch.int32)
    if rows is None:
        rows = int(offs[-1])  # host read: slicing to the real rows keeps the tail out of every amax
    out = chain(x[:rows], offs).type_as(x)
    return F.pad(out, (0, 0, 0, x.shape[0] - rows))


def experts_forward_padded(x: torch.Tensor, num_tokens_per_expert: torch.Tensor, chain, align: int) -> torch.Tensor:
    """experts_forward with each expert's contiguous rows padded to a multiple of `align` (zeros), the padding rows
    dropped from the output."""
    x_padded, sizes, dest = pad_token_groups(x, num_tokens_per_expert, align)
    return experts_forward(x_padded, sizes, chain, rows=x_padded.shape[0]).index_select(0, dest)


def _weights_mms(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, recipe: FourOverSixRecipe,
                 quantized: tuple[QuantizedWeight | None, ...]):
    """gated's mms over the (E, out, in) weights, with their cached QuantizedWeights or Nones."""
    weights = dict(zip(_NAMES, (w1, w2, w3)))
    cached = dict(zip(_NAMES, quantized))

    def mms(names, A, offs):
        qws = [cached[n] for n in names]
        if any(q is None for q in qws):
            if any(q is not None for q in qws):
                raise ValueError(f"the cached QuantizedWeights of {names} are partial; give all of them or none")
            qws = None
        return four_over_six_grouped_mms(A, [weights[n].transpose(-2, -1) for n in names], offs, recipe=recipe,
                                         quantized_weights=qws)
    return mms


def run_experts(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, x: torch.Tensor,
                num_tokens_per_expert: torch.Tensor, recipe: FourOverSixRecipe, rows: int | None = None,
                quantized: tuple[QuantizedWeight | None, ...] = _NO_CACHE) -> torch.Tensor:
    """experts_forward on the weights w1, w2, w3 (E, out, in); `quantized`: their cached QuantizedWeights in
    (w1, w2, w3) order, or Nones."""
    return experts_forward(x, num_tokens_per_expert, gated(_weights_mms(w1, w2, w3, recipe, quantized)), rows)


def run_experts_padded(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, x: torch.Tensor,
                       num_tokens_per_expert: torch.Tensor, recipe: FourOverSixRecipe,
                       align: int = GROUP_ALIGN,
                       quantized: tuple[QuantizedWeight | None, ...] = _NO_CACHE) -> torch.Tensor:
    """experts_forward_padded on the weights w1, w2, w3 (as run_experts)."""
    return experts_forward_padded(x, num_tokens_per_expert, gated(_weights_mms(w1, w2, w3, recipe, quantized)), align)


def _cast_gated(A: torch.Tensor, offs: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor,
                recipe: FourOverSixRecipe, dtype: torch.dtype | None) -> torch.Tensor:
    """gated over the weights cast to `dtype` (autocast's; None: as given), the graph compiled_chain compiles."""
    return gated(_weights_mms(*cast_operands((w1, w2, w3), dtype), recipe, _NO_CACHE))(A, offs)


@functools.cache
def _compiled_cast_gated(backend: str):
    options = {"emulate_precision_casts": True} if backend == "inductor" else None
    return torch.compile(_cast_gated, backend=backend, fullgraph=True, options=options)


def compiled_chain(weights: list[torch.Tensor], recipe: FourOverSixRecipe, dtype: torch.dtype | None, backend: str):
    """A chain(A, offs) running the weights' cast and the gated chain as one torch.compile graph (`backend`), as
    torchtitan 0.2 compiles its bf16 experts' `_run_experts_grouped_mm`: Inductor fuses the casts, their
    gradients' casts and the SiLU gate around the grouped GEMMs, which stay opaque custom ops. With
    emulate_precision_casts, Inductor's Triton kernels round the gate's SiLU to bf16 before the product as eager
    does, so every byte is eager's (checked on CUDA). A's rows change every step: marked dynamic, one graph serves
    them all."""
    fn = _compiled_cast_gated(backend)

    def chain(A: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        torch._dynamo.maybe_mark_dynamic(A, 0)
        return fn(A, offs, *weights, recipe, dtype)
    return chain


def pad_token_groups(x: torch.Tensor, num_tokens_per_expert: torch.Tensor,
                     align: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x with each expert's rows zero-padded to a multiple of `align`, the padded group sizes, the padded row of
    each row of x): the layout the experts' grouped GEMMs run on without expert parallelism."""
    counts = num_tokens_per_expert.to(torch.int64)  # torchtitan's histc may hand floats
    sizes = (counts + align - 1) // align * align
    shift = (torch.cumsum(sizes, 0) - sizes) - (torch.cumsum(counts, 0) - counts)
    expert_of_row = torch.repeat_interleave(torch.arange(counts.numel(), device=x.device), counts,
                                            output_size=x.shape[0])
    dest = shift[expert_of_row] + torch.arange(x.shape[0], device=x.device)
    total = int(sizes.sum())  # the one host sync of this path
    return x.new_zeros(total, x.shape[1]).index_copy(0, dest, x), sizes, dest


def ep_dispatched(module: nn.Module) -> bool:
    """Whether expert parallelism's dispatcher already padded the token groups (torchtitan's test: an "ep" mesh)."""
    return is_dtensor(module.w1) and "ep" in (module.w1.device_mesh.mesh_dim_names or ())


class _FourOverSixExperts:
    """Mixin placed before the parent experts class; see the module docstring."""

    recipe: FourOverSixRecipe
    pad_multiple: int
    weight_cache: WeightCache | None = None
    compile_backend: str | None = None

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        quantize = None if self.weight_cache is None else functools.partial(cached_weights, self, self.weight_cache,
                                                                              recipe=self.recipe)
        return self.run(x, num_tokens_per_expert, self.recipe, quantize, self.compile_backend)

    def run(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor, recipe: FourOverSixRecipe,
            quantize=None, compile_backend: str | None = None) -> torch.Tensor:
        """The forward with `recipe`; quantize(weights): the (w1, w2, w3) operands' QuantizedWeights, or None to
        quantize them in each GEMM; compile_backend: see convert_experts. Rollouts run it with their own recipe
        and cache (rl/experts.py)."""
        if x.is_meta:
            raise NotImplementedError(f"{type(self).__name__} cannot run on the meta device: its token groups are "
                                      "padded by their sizes, which a meta tensor does not hold (converted Linears "
                                      "trace shapes on meta; trace the experts on a real device)")
        pad_multiple = None if ep_dispatched(self) else self.pad_multiple
        return converted_experts_forward(self, _NAMES, x, num_tokens_per_expert, recipe, quantize, pad_multiple,
                                         compile_backend)

    def extra_repr(self) -> str:
        cached = ", cache_weights=True" if self.weight_cache is not None else ""
        compiled = f", compile_backend={self.compile_backend!r}" if self.compile_backend else ""
        return f"recipe={self.recipe}, pad_multiple={self.pad_multiple}{cached}{compiled}"


def converted_experts_forward(module: nn.Module, names: tuple[str, str, str], x: torch.Tensor,
                              num_tokens_per_expert: torch.Tensor, recipe: FourOverSixRecipe, quantize=None,
                              pad_multiple: int | None = None, compile_backend: str | None = None) -> torch.Tensor:
    """A converted experts module's forward, for torchtitan 0.2's experts classes (the mixin) and 0.3's alike: its
    (w1, w2, w3) parameters `names` as local weights, autocast like torchtitan's, the experts' chain with
    `recipe` on x's token groups; quantize(weights): their QuantizedWeights or None (quantized in each GEMM);
    pad_multiple: pad each token group to that many rows here (None: a dispatcher already padded them);
    compile_backend: the weights' cast and the chain compiled (compiled_chain) on CUDA where weights are quantized
    in each GEMM (a weight cache is filled eagerly: that chain runs eagerly; on the CPU, torch 2.11's Inductor
    keeps the SiLU gate unrounded in its C++ kernels, emulate_precision_casts or not, so the chain stays eager
    there and its bytes stay eager's)."""
    weights = [local_weight(getattr(module, n), n, experts=True) for n in names]
    dtype = autocast_dtype(x.device)
    with no_autocast(x.device):
        x_in, = cast_operands((x, ), dtype)
        if compile_backend is not None and quantize is None and x.is_cuda:
            chain = compiled_chain(weights, recipe, dtype, compile_backend)
        else:
            weights = cast_operands(weights, dtype)
            chain = gated(_weights_mms(*weights, recipe, _NO_CACHE if quantize is None else quantize(weights)))
        if pad_multiple is None:
            out = experts_forward(x_in, num_tokens_per_expert, chain)
        else:
            out = experts_forward_padded(x_in, num_tokens_per_expert, chain, pad_multiple)
        return out.to(x.dtype)


def cached_weights(module: nn.Module, cache: WeightCache, weights: list[torch.Tensor], recipe: FourOverSixRecipe,
                   names: tuple[str, str, str] = _NAMES) -> tuple[QuantizedWeight | None, ...]:
    """The QuantizedWeights of a converted experts module's (w1, w2, w3) operands `weights` (its parameters
    `names` as its forward hands them to the op) from `cache`, quantized with `recipe` on a miss."""
    return tuple(cache.get(n, getattr(module, n), w,
                           functools.partial(quantize_grouped_weight, w.transpose(-2, -1), recipe=recipe))
                 for n, w in zip(names, weights))


_CLASSES: dict[type, type] = {}


def four_over_six_experts_class(parent: type[nn.Module]) -> type[nn.Module]:
    """The four-over-six subclass of `parent`, created on first use and cached."""
    if issubclass(parent, _FourOverSixExperts):
        return parent
    cls = _CLASSES.get(parent)
    if cls is None:
        cls = type(f"FourOverSix{parent.__name__}", (_FourOverSixExperts, parent), {"__module__": __name__})
        _CLASSES[parent] = cls
    return cls


def convert_experts(module: nn.Module, recipe: FourOverSixRecipe, pad_multiple: int = GROUP_ALIGN,
                    cache_weights: bool = False, compile_backend: str | None = None) -> nn.Module:
    """Turn `module` (an experts instance) into its four-over-six subclass in place and return it; without
    expert parallelism it pads each token group to `pad_multiple` rows; cache_weights: quantize the weights once
    per optimizer step (weight_cache.py); compile_backend: torch.compile the weights' cast and the gated chain
    with this backend (what torchtitan 0.2 does to its own experts when it compiles the model; None: eager)."""
    check_recipe(recipe)
    check_pad_multiple(pad_multiple)
    for name in _NAMES:
        w = getattr(module, name, None)
        if not isinstance(w, torch.Tensor) or w.dim() != 3:
            raise TypeError(f"{type(module).__name__}.{name} must be a 3-D (experts, out, in) parameter")
    resolved = recipe.resolve(grouped=True)  # raises for a backward grouped GEMMs do not define
    module.__class__ = four_over_six_experts_class(type(module))
    module.recipe = resolved
    module.pad_multiple = pad_multiple
    module.weight_cache = WeightCache() if cache_weights else None
    module.compile_backend = compile_backend
    return module
