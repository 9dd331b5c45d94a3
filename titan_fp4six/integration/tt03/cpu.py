"""The CPU adjustments torchtitan 0.3 needs to train with no accelerator (the 0.2 ones: integration/cpu.py).

Why: torchtitan 0.3 still picks "cuda" without an accelerator and fails at ``set_device``; its memory monitor asks
``torch.cuda`` for statistics; the padding token dispatcher (torchao's ``permute_and_pad``) fills its permutation with
a Triton kernel unless told to use its CPU path; and FSDP2's ``PREMUL_SUM(1.0)`` reduce-scatter is one gloo lacks.
Each patch keeps numerics, as in 0.2. The router counts tokens with a boolean sum in 0.3, so no histc patch.
FlexAttention has no CPU backward, so `causal_sdpa` gives the trainer causal SDPA attention instead (what the 0.2
debug flavors compute: causal over the whole sequence, no per-document masks).
"""

import functools

from .. import cpu

_applied = False


def applied() -> bool:
    return _applied


def causal_sdpa(model_config) -> None:
    """Swap every FlexAttention config of `model_config` for causal SDPA (in place)."""
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention

    for _, _, parent, attr in list(model_config.traverse(FlexAttention.Config)):
        setattr(parent, attr, ScaledDotProductAttention.Config())


def apply() -> None:
    """Point torchtitan 0.3 at the CPU (idempotent). Call before building the Trainer, only without a GPU."""
    global _applied
    if _applied:
        return
    import torchao.prototype.moe_training.ep.kernels as ao_kernels
    import torchao.prototype.moe_training.ep.permute as ao_permute
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.fsdp as fsdp
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.models.common.token_dispatcher as token_dispatcher
    import torchtitan.tools.profiler as profiler
    import torchtitan.tools.utils as tt_utils

    cpu.point_at_cpu((tt_utils, metrics, dist_utils, parallel_dims, token_dispatcher, profiler))
    ao_permute.generate_permute_indices = functools.partial(ao_kernels.generate_permute_indices, use_cpu=True)
    fsdp.disable_fsdp_gradient_division = cpu.sum_reductions(fsdp.disable_fsdp_gradient_division)
    _applied = True
