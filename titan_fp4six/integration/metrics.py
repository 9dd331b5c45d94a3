"""MFU against the peak that matches what runs, and the map-to-4 fraction, in torchtitan's metrics.

torchtitan divides model FLOPs by the bf16 dense peak. The emulated four-over-six GEMMs (Hopper, CPU) are
bf16 work, so that peak is right for them. Where the quantized GEMMs run on FP4 tensor cores (Blackwell),
their share of the FLOPs is timed against the FP4 peak: the peak becomes the harmonic mix
F / (F_fp4 / P_fp4 + (F - F_fp4) / P_bf16), so MFU = 100 * achieved / attainable-at-peak.

Hook: torchtitan gives converters no handle on its MetricsProcessor, and the processor is built by
`torchtitan.train` (or a copy of it run as `__main__`), so a wrapper is installed once on
`MetricsProcessor.log` when a four-over-six converter is built. Before calling the original it sets
`gpu_peak_flops` to the matching peak (logged once, saying which peak it is; torchtitan 0.3, which reports no MFU
for a model with `has_quantization`, is told the peak now matches), adds the map-to-4 fraction
to `extra_metrics` (so tensorboard/wandb get it) and, through a logging filter held for that call only,
appends `four_over_six map4: <fraction>` to torchtitan's console step line. A second wrapper on
`MetricsProcessor.should_log` (which torchtitan calls at the end of every step) turns the map-to-4 counting on
for the steps that will be logged only, so the fraction is that of the logged step's forward quantizations
and the other steps pay nothing for it; it also hands the end of each step to the fidelity telemetry
(fidelity.step_end, a no-op unless a section sets fidelity_every).
"""

import functools
import logging
from dataclasses import dataclass

import torch
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.tools.logging import logger

from ..quant.backends import backends_for
from ..quant.recipe import FourOverSixRecipe
from ..quant.process_state import MAP4_STATS
from . import fidelity, rounding

MAP4_METRIC = "four_over_six/map4_fraction"

FP4_PEAKS = {  # device-name substring -> (dense bf16, dense NVFP4) FLOP/s, NVIDIA Blackwell datasheets
    "GB200": (2.5e15, 10e15),
    "B200": (2.25e15, 9e15),
}

_tracked: dict[str, tuple[int, FourOverSixRecipe, bool]] = {}


def track(fqn: str, active_params: int, recipe: FourOverSixRecipe, *, grouped: bool) -> None:
    """Record a converted module: its weight params active per token and how its GEMMs run."""
    _tracked[fqn] = (active_params, recipe, grouped)


def fp4_flops_per_param(recipe: FourOverSixRecipe, grouped: bool) -> int:
    """FLOPs per token per weight param of the GEMMs that run as NVFP4 GEMMs where the recipe's GEMMs run in FP4:
    the forward GEMM (2), per-tensor, per-group or row-scaled, plus for a backward resolving to "quantized" the
    dgrad (2) and, dense only, the wgrad (2; the grouped wgrad, over each group's tokens, is always emulated:
    docs/ops.md); other backwards are bf16."""
    if recipe.plan(grouped).backward != "quantized":
        return 2
    return 4 if grouped else 6


def fp4_flops_per_token(device: torch.device) -> int:
    """The FP4 FLOPs per token of the converted modules whose GEMMs run in FP4 on `device`, as their resolved
    backends say (the gemm knob, TITAN_FP4SIX_EMULATE and the device: the decision the ops take)."""
    return sum(params * fp4_flops_per_param(recipe, grouped) for params, recipe, grouped in _tracked.values()
               if backends_for(recipe.quantizer, recipe.gemm, device).fp4)


def compute_dtype(job_config, parallel_dims) -> str:
    """The dtype torchtitan computes in: mixed_precision_param under FSDP or AMP (single device / DDP),
    training.dtype where it applies neither (TP or PP without FSDP)."""
    training = job_config.training
    amp = not (parallel_dims.tp_enabled or parallel_dims.pp_enabled)
    if training.dtype == "bfloat16" or not (parallel_dims.fsdp_enabled or amp):
        return training.dtype
    return training.mixed_precision_param


def run_fp4_flops(job_config, parallel_dims) -> int:
    """This run's FP4 FLOPs per token: fp4_flops_per_token on its GPU where it computes in bf16 (the FP4 kernels
    emit bf16; other dtypes run the emulation), else 0."""
    if not torch.cuda.is_available() or compute_dtype(job_config, parallel_dims) != "bfloat16":
        return 0
    return fp4_flops_per_token(torch.device("cuda", torch.cuda.current_device()))


@dataclass(frozen=True)
class MfuPeak:
    flops: float
    description: str


def select_peak(device_name: str, bf16_peak: float, flops_per_token: float, fp4_flops: float) -> MfuPeak:
    """The peak for MFU given the FP4 FLOPs per token (run_fp4_flops; 0: every GEMM emulated in bf16)."""
    if fp4_flops <= 0:
        return MfuPeak(bf16_peak, f"bf16 peak {bf16_peak:.3e} FLOP/s (four-over-six GEMMs are emulated in bf16)")
    peaks = next((p for name, p in FP4_PEAKS.items() if name in device_name), None)
    if peaks is None:
        return MfuPeak(bf16_peak, f"bf16 peak {bf16_peak:.3e} FLOP/s for all FLOPs: no FP4 peak known for "
                                  f"{device_name!r}, so MFU overstates utilization of the FP4 GEMMs")
    bf16, fp4 = peaks
    share = min(fp4_flops / flops_per_token, 1.0)
    peak = 1.0 / (share / fp4 + (1.0 - share) / bf16)
    return MfuPeak(peak, f"mixed peak {peak:.3e} FLOP/s: {share:.1%} of model FLOPs in NVFP4 GEMMs at "
                         f"{fp4:.3e}, the rest at bf16 {bf16:.3e}")


def _peak_for(processor: MetricsProcessor) -> MfuPeak:
    peak = getattr(processor, "_four_over_six_peak", None)
    if peak is None:
        job_config = getattr(processor, "job_config", None)
        if job_config is None:  # torchtitan 0.3's processor has no job config; the plugin's trainer hands it over
            raise RuntimeError("four_over_six MFU needs the run's config on torchtitan's MetricsProcessor: with "
                               "torchtitan 0.3, train with titan_fp4six.integration.tt03's FourOverSixTrainer "
                               "(its registry functions do)")
        peak = select_peak(processor.device_memory_monitor.device_name, processor.gpu_peak_flops,
                           processor.num_flops_per_token, run_fp4_flops(job_config, processor.parallel_dims))
        processor._four_over_six_peak = peak
        logger.info(f"four_over_six: MFU is computed against the {peak.description}")
    return peak


class _AppendToStepLine(logging.Filter):
    """Appends text to torchtitan's console step line (the record holding "step:" and "loss:")."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "step:" in record.msg and "loss:" in record.msg:
            record.msg += self.text
        return True


def install() -> None:
    """Wrap MetricsProcessor.log once (idempotent); see the module docstring."""
    if getattr(MetricsProcessor.log, "_four_over_six", False):
        return
    original = MetricsProcessor.log

    @functools.wraps(original)
    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        self.gpu_peak_flops = _peak_for(self).flops
        self.has_quantization = False  # torchtitan 0.3 drops MFU for quantized models (bf16 peak); this peak matches
        fraction = MAP4_STATS.read_and_reset()
        extra = dict(extra_metrics or {})
        if fraction is not None:
            extra[MAP4_METRIC] = fraction
        step_line = _AppendToStepLine(f"  four_over_six map4: {'n/a' if fraction is None else f'{fraction:.4f}'}")
        logger.addFilter(step_line)
        try:
            original(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)
        finally:
            logger.removeFilter(step_line)

    log._four_over_six = True
    MetricsProcessor.log = log
    original_should_log = MetricsProcessor.should_log

    @functools.wraps(original_should_log)
    def should_log(self, step):
        # torchtitan asks at the end of every step: count map-to-4 blocks only during the steps that will be logged
        # (the counting costs a reduction launch per quantized operand; the steps in between need none)
        MAP4_STATS.enabled = original_should_log(self, step + 1)
        fidelity.step_end(self, step)  # its GEMMs may take rounding seeds: before the next step's are set
        rounding.start_step(getattr(self, "job_config", None), step + 1)  # the next step's gradient rounding seeds
        return original_should_log(self, step)

    MetricsProcessor.should_log = should_log
