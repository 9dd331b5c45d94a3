"""Fidelity telemetry in training: every `fidelity_every` steps, the per-GEMM metrics of modules/fidelity/ for
that step's batch, logged through torchtitan's loggers (tensorboard / wandb).

Why: the CLI (`python -m titan_fp4six.fidelity`) measures one model state; this shows how each layer's NVFP4 and
4/6 fidelity and map-to-4 fraction evolve as a run trains. A converter whose section sets fidelity_every = N > 0
attaches a FidelityCapture to the modules it converted (none otherwise: off costs nothing). The metrics module's
should_log wrapper, which torchtitan calls at the end of every step, calls `step_end`: it logs what the step
measured and arms the captures for the next step when that is a multiple of N (the hooks of other steps return at
once). A measured step runs each converted GEMM's quantized forward and backward again per format and backward mode
in its output-gradient hook, the weights still those of the forward (first micro-batch only; the training
operands, and the experts' inner operands from an unquantized rerun of their chain). Every rank measures its own
batch; torchtitan's loggers write rank 0's.
"""

from torch import nn
from torchtitan.tools.logging import logger

from ..modules.fidelity import FidelityCapture, mean_metrics

PREFIX = "four_over_six_fidelity"
_captures: list[tuple[int, FidelityCapture]] = []


def attach(every: int, modules: list[tuple[str, nn.Module]]) -> None:
    """Measure `modules` ((fqn, module) pairs) at the steps that are multiples of `every` (steps count from 1)."""
    capture = FidelityCapture(modules)
    capture.active = every == 1
    _captures.append((every, capture))


def step_end(processor, step: int) -> None:
    """Log the metrics step `step` measured (keys PREFIX/<gemm>/<metric>/<nvfp4|four_over_six>) with
    processor.logger; arm the captures due at step + 1."""
    for every, capture in _captures:
        results = capture.take()
        if results:
            processor.logger.log({f"{PREFIX}/{gemm}/{key}": value for gemm, metrics in results.items()
                                  for key, value in metrics.items()}, step)
            mean = mean_metrics(results)
            logger.info(f"{PREFIX} step {step}: {len(results)} GEMMs, mean forward SNR NVFP4 "
                        f"{mean['fwd_snr_db/nvfp4']:.2f} dB, 4/6 {mean['fwd_snr_db/four_over_six']:.2f} dB")
        capture.active = (step + 1) % every == 0
