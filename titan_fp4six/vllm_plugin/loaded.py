"""What vLLM's loader wrote into a layer's quantized parameters, checked once after loading: uint8 codes have no
spare value to mark "never loaded", so each parameter's weight_loader is wrapped to record the shards it loaded;
scales and factors start NaN and must end finite. A folder with a missing or short tensor, or a non-finite scale
or factor, is refused at load naming the layer, instead of serving uninitialized codes or NaN; so is a tensor of
another dtype (a bf16 `weight` where config.json lists the module as quantized), before vLLM's loader sees it."""

import functools

import torch

REEXPORT = "re-export the folder with python -m titan_fp4six.export --format nvfp4"


def recording(loader, record):
    """`loader` that calls record(*args, **kwargs) after each load it did not refuse (a MoE loader returns False
    for an expert of another rank under expert parallelism)."""
    @functools.wraps(loader)  # keeps the loader's attributes (supports_moe_loading)
    def load(*args, **kwargs):
        result = loader(*args, **kwargs)
        if result is not False:
            record(*args, **kwargs)
        return result
    return load


def dummy_load() -> bool:
    """load_format='dummy' (random weights, no loader calls): nothing to check for completeness."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return config is not None and str(config.load_config.load_format) == "dummy"


QUANTIZED = {"weight": (torch.uint8, "codes"), "weight_scale": (torch.float8_e4m3fn, "block scales"),
             "weight_scale_2": (torch.float32, "global decode factors")}
"""Each quantized parameter's dtype in an nvfp4 export (a MoE layer's w13_/w2_ prefixed), and what it holds."""


def not_quantized(prefix: str, name: str, module: str, want: str, loaded: torch.Tensor) -> ValueError | None:
    """The error for a checkpoint tensor whose dtype is not parameter `name`'s in an nvfp4 export (a bf16 `weight`
    of a module that config.json lists as quantized), or None; want: the expected shape, in words."""
    kind = name.split("_", 1)[1] if name.startswith(("w13_", "w2_")) else name
    dtype, what = QUANTIZED[kind]
    if loaded.dtype == dtype:
        return None
    plain = " (an unquantized weight: the folder's tensors are not the nvfp4 export its config.json describes)" \
        if kind == "weight" and loaded.dtype.is_floating_point else ""
    return ValueError(f"four_over_six: {prefix}.{name}: config.json's quantization_config lists {module} as "
                      f"quantized, so its {kind} in the checkpoint should be {dtype} {what}{want}, but the checkpoint "
                      f"holds {loaded.dtype} of shape {tuple(loaded.shape)}{plain}; {REEXPORT}")


def incomplete(prefix: str, name: str, detail: str) -> ValueError:
    return ValueError(f"four_over_six: {prefix}.{name} was not loaded completely from the checkpoint ({detail}): "
                      f"the folder lacks or truncates this tensor; {REEXPORT}")


def check_finite(layer: torch.nn.Module, prefix: str, names) -> None:
    for name in names:
        values = getattr(layer, name).detach().float()
        bad = (~torch.isfinite(values)).sum().item()
        if bad:
            raise ValueError(f"four_over_six: {prefix}.{name} holds non-finite values after loading ({bad} of "
                             f"{values.numel()} NaN/Inf block scales or global factors): the checkpoint lacks them "
                             f"or was written from non-finite weights; {REEXPORT} from a finite checkpoint")
