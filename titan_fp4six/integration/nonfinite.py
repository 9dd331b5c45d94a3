"""The launchers' stop at a non-finite loss or grad norm (torchtitan 0.2.x and 0.3.x): torchtitan itself trains
on, saves the diverged weights and exits 0. training.allow_nonfinite lets an experiment go on."""

import contextlib
import math

import torch

from .version import trainer_config


def nonfinite_allowed(training) -> bool:
    """The [training] section's allow_nonfinite (false without the plugin's config module, which adds it)."""
    allow = getattr(training, "allow_nonfinite", False)
    if type(allow) is not bool:
        raise ValueError(f"training.allow_nonfinite={allow!r}; it must be true or false")
    return allow


def check_finite(step: int, loss: float, grad_norm: float, allow: bool, seen_at: int | None = None) -> None:
    """Stop at the first step whose loss or grad norm is NaN or Inf (read at step `seen_at`, default `step`),
    before the checkpoint of the step that reads it: torchtitan would train on, save the diverged weights and
    exit 0."""
    bad = {name: value for name, value in (("loss", loss), ("grad norm", grad_norm)) if not math.isfinite(value)}
    if bad and not allow:
        where = ("stopped before this step's checkpoint" if seen_at in (None, step) else
                 f"stopped at step {seen_at} (the first step that read it), before its checkpoint")
        raise FloatingPointError(
            f"step {step}: non-finite {' and '.join(f'{k} ({v})' for k, v in bad.items())}; {where}. Resume from an "
            "earlier checkpoint (with a lower learning rate, or checked data and optimizer state), or set "
            "training.allow_nonfinite = true to train on")


class NonFiniteWatch:
    """The first step whose loss or grad norm is not finite, kept on the loss's device and read by `check` only:
    the launcher checks on the steps where torchtitan reads the loss anyway (logging) and before a checkpoint is
    written, so no step waits for the GPU just to be checked."""

    def __init__(self):
        self.first: torch.Tensor | None = None  # (step, loss, grad norm) in float64; step -1 while all finite

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        values = torch.cat([torch.full((1,), float(step), dtype=torch.float64, device=loss.device),
                            loss.detach().reshape(1).double(), grad_norm.detach().reshape(1).double()])
        if self.first is None:
            self.first = torch.full_like(values, -1.0)
        bad = ~torch.isfinite(values[1:]).all() & (self.first[0] < 0)
        self.first = torch.where(bad, values, self.first)

    def check(self, step: int) -> None:
        """Raise (check_finite) if a step up to `step` was not finite; one host sync."""
        if self.first is None:
            return
        first_step, loss, grad_norm = self.first.tolist()
        if first_step >= 0:
            check_finite(int(first_step), loss, grad_norm, allow=False, seen_at=step)


@contextlib.contextmanager
def _recording(module, name: str, results: list):
    """Within the block, module.<name>(...) also appends its result to `results` (torchtitan's train_step keeps
    the grad norm to itself on the steps it does not log)."""
    original = getattr(module, name)

    def recorded(*args, **kwargs):
        results.append(original(*args, **kwargs))
        return results[-1]

    setattr(module, name, recorded)
    try:
        yield
    finally:
        setattr(module, name, original)


class NonFiniteStop:
    """Mixin over torchtitan's Trainer (0.2.x and 0.3.x): stop the run at a non-finite loss or grad norm unless
    training.allow_nonfinite (the error names the first bad step), read on logging, checkpoint and last steps."""

    def forward_backward_step(self, *args, **kwargs):
        loss = super().forward_backward_step(*args, **kwargs)
        self._step_losses.append(loss.detach().clone())  # clone: a CUDA-graph replay may overwrite the output
        return loss

    def train_step(self, data_iterator):
        from torchtitan.distributed import utils as dist_utils

        if not hasattr(self, "_nonfinite"):
            self._nonfinite, self._step_losses = NonFiniteWatch(), []
        self._step_losses.clear()
        grad_norms = []
        with _recording(dist_utils, "clip_grad_norm_", grad_norms):
            super().train_step(data_iterator)
        training = trainer_config(self).training
        if nonfinite_allowed(training):
            return
        self._nonfinite.record(self.step, torch.stack(self._step_losses).sum(), grad_norms[-1])
        last = self.step == training.steps
        should_save = getattr(self.checkpointer, "_should_save", None)
        if (last or self.metrics_processor.should_log(self.step) or should_save is None
                or should_save(self.step, last)):
            self._nonfinite.check(self.step)
