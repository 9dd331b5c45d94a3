"""The torchtitan 0.3 Trainer with the plugin's CLI sections: `--model.converters` and
`--quantize.{linear,grouped_mm}.four_over_six.<knob>`, the same keys as the 0.2 TOML recipes.

torchtitan 0.3 converts the model config inside the registry function, before the command line is read, so a knob
given there could not be overridden. The registry functions (config_registry) instead return this trainer's Config
with the sections filled in, and the trainer applies the converters the config lists after parsing, before
torchtitan builds the model. It also hands the run's config to the MFU peak (metrics), and drops cached weight
quantizations after every optimizer step (cache_weights). On the CPU (the launcher's patches applied) attention is
causal SDPA (tt03/cpu.py).
"""

from dataclasses import dataclass, field

from torchtitan.config import TrainingConfig
from torchtitan.trainer import Trainer

from ...modules.weight_cache import invalidate_weight_caches
from .. import conversion, rules
from ..nonfinite import NonFiniteStop
from ..rounding import RoundingSeedPerStep
from . import cpu
from ..sections import FAMILY, make_quantize_sections
from .converters import FourOverSixGroupedExpertsConverter, FourOverSixLinearConverter

CONVERTERS = {f"quantize.linear.{FAMILY}": ("linear", FourOverSixLinearConverter),
              f"quantize.grouped_mm.{FAMILY}": ("grouped_mm", FourOverSixGroupedExpertsConverter)}


@dataclass(kw_only=True, slots=True)
class ModelSection:
    converters: list[str] = field(default_factory=list)
    """The plugin's converters to apply, in order: quantize.linear.four_over_six, quantize.grouped_mm.four_over_six."""


@dataclass(kw_only=True, slots=True)
class Training(TrainingConfig):
    allow_nonfinite: bool = False
    """Train on past a step whose loss or grad norm is NaN or Inf (default: stop with an error naming the step)."""


Quantize, QuantizedLinear, QuantizedGroupedMM = make_quantize_sections(
    __name__, FourOverSixLinearConverter.Config, FourOverSixGroupedExpertsConverter.Config, kw_only=True, slots=True)


def sections(config) -> dict[str, object]:
    """The converter configs by converter name."""
    return {name: getattr(getattr(config.quantize, kind), FAMILY) for name, (kind, _) in CONVERTERS.items()}


def check_config(config) -> None:
    """Converter names, sections without their converter, and the settings no section can run under."""
    listed = config.model.converters
    rules.check_known_converters(listed, CONVERTERS)
    for name, cfg in sections(config).items():
        kind = CONVERTERS[name][0]
        if name not in listed:
            rules.check_section_listed(name, cfg != type(cfg)(), listed)
            continue
        if cfg.fidelity_every:
            raise ValueError(f"{name}.fidelity_every={cfg.fidelity_every}: the fidelity telemetry runs with "
                             "torchtitan 0.2.x only; set it to 0 (python -m titan_fp4six.fidelity measures a "
                             "checkpoint either way)")
        conversion.check_section(kind, cfg, listed, config.compile, config.parallelism)


class FourOverSixTrainer(RoundingSeedPerStep, NonFiniteStop, Trainer):
    """torchtitan 0.3's Trainer, converting the model config first and stopping at a non-finite loss or grad norm
    (training.allow_nonfinite); see the module docstring."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        training: Training = field(default_factory=Training)
        model: ModelSection = field(default_factory=ModelSection)
        quantize: Quantize = field(default_factory=Quantize)

    def __init__(self, config: Config):
        check_config(config)
        spec, compiled = config.model_spec, config.compile.enable and "model" in config.compile.components
        if cpu.applied():
            cpu.causal_sdpa(spec.model)
        for name in config.model.converters:
            cfg = sections(config)[name]
            cfg.model_compile_enabled = compiled
            spec.model = cfg.build().convert(spec.model)
        super().__init__(config)
        self.metrics_processor.job_config = config  # the MFU peak's compute dtype (metrics.compute_dtype)
        if any(cfg.cache_weights for name, cfg in sections(config).items() if name in config.model.converters):
            self.optimizers.register_step_post_hook(
                lambda *_: [invalidate_weight_caches(part) for part in self.model_parts])
