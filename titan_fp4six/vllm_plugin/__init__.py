"""The `four_over_six` quantization method for vLLM: serves `python -m titan_fp4six.export --format nvfp4`
checkpoints with the trainer's own ops, so an engine quantizes activations the way training did.

vLLM loads it through this package's `vllm.general_plugins` entry point (pyproject.toml), in every engine
process; `register()` only registers the config class (config.py), whose methods (linear.py, moe.py) import
the package's ops. Stock vLLM has no NVFP4 kernel on the CPU and quantizes activations with a static global
scale and map-to-6 only; this method quantizes them as the module's recipe says (dynamic per-tensor or per-row
amax, the 4/6 choice, its scale bound) and runs the package's GEMMs: emulated off Blackwell, real FP4 on
Blackwell where the ops pick them. The loaded parameters stay the checkpoint's packed tensors, read on every
forward, so an RL weight update that copies new codes, scales and factors into them in place takes effect at
once.
"""


import os


def register() -> None:
    """The `vllm.general_plugins` entry point: register `four_over_six` with vLLM (idempotent)."""
    scalar_inductor_on_default_capability()
    from . import config  # noqa: F401  (its decorator registers the config class)


def scalar_inductor_on_default_capability() -> None:
    """Under ATEN_CPU_CAPABILITY=default, vLLM's sampler torch.compiles a helper (its logprob ranks) whose Inductor
    C++ uses at::vec types that the default-capability build does not declare ("'at::vec' has not been
    declared"): compile it scalar there. Also called by the RL vLLM generator before it starts an engine."""
    if os.environ.get("ATEN_CPU_CAPABILITY") == "default":
        import torch._inductor.config

        torch._inductor.config.cpp.simdlen = 1
