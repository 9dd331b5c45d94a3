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


def register() -> None:
    """The `vllm.general_plugins` entry point: register `four_over_six` with vLLM (idempotent)."""
    from . import config  # noqa: F401  (its decorator registers the config class)
