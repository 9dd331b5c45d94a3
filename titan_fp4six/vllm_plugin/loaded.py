"""What vLLM's loader wrote into a layer's quantized parameters, checked once after loading: uint8 codes have no
spare value to mark "never loaded", so each parameter's weight_loader is wrapped to record the shards it loaded;
scales and factors start NaN and must end finite. A folder with a missing or short tensor, or a non-finite scale
or factor, is refused at load naming the layer, instead of serving uninitialized codes or NaN."""

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
