"""`python -m scripts.step_dump DUMP [LOAD [--no-yarn]] -- <titan_fp4six.train arguments>`: train through the
launcher of the installed torchtitan (0.2.2 or 0.3.0) and write to DUMP (torch.save, after every step) the
model's initial state dict (seeded, nothing trained yet), the batches the loader gave (`loader_batches`), the
batches trained on (`batches`: input dict and labels), the step losses and the step-1 gradients (`grads`).

Why: the study of docs/results/tt03_parity.md (why 0.2.2 and 0.3.0 train the same recipe to other losses) and
its pinned check, tests/test_tt03_parity.py; a debugging tool of the lab, not the package's.

With LOAD (a DUMP of a 0.2.2 run, read under torchtitan 0.3), the 0.3 model starts from that run's weights (names
mapped by `to_tt03`) and each step trains on that run's batch, so the two runs' losses differ only by how the
versions compute them. `--no-yarn` after LOAD also gives the 0.3 model 0.2's attention at these lengths: 0.2 sets
max_seq_len to training.seq_len and scales RoPE (YaRN frequencies, softmax scale x mscale^2) only past
original_seq_len (4096), 0.3 always scales with the flavor's max_seq_len 16384.
"""

import argparse
import dataclasses
import sys

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

FULL = StateDictOptions(full_state_dict=True)  # plain tensors, not the DTensors of the FSDP-wrapped model
RENAMED_02_TO_03 = ((".moe.experts.w1", ".moe.routed_experts.inner_experts.w1_EFD"),
                    (".moe.experts.w2", ".moe.routed_experts.inner_experts.w2_EDF"),
                    (".moe.experts.w3", ".moe.routed_experts.inner_experts.w3_EFD"),
                    (".moe.expert_bias", ".moe.expert_bias_E"),
                    ("output.weight", "lm_head.weight"))


def to_tt03(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A torchtitan 0.2.2 DeepSeek-V3 state dict under torchtitan 0.3.0's parameter names."""
    out = {}
    for name, value in state.items():
        for old, new in RENAMED_02_TO_03:
            if old in name:
                name = name.replace(old, new)
                break
        out[name] = value
    return out


def _trainer_class():
    from titan_fp4six.integration.version import series

    if series() == "0.3":
        from torchtitan.trainer import Trainer
    else:
        from torchtitan.train import Trainer
    return Trainer


def without_yarn(Trainer) -> None:
    """Build 0.3 models with RoPE scaling "none" (plain frequencies, softmax scale qk_head_dim^-0.5)."""
    init = Trainer.__init__

    def __init__(self, config):
        for layer in config.model_spec.model.layers:
            layer.attention.rope = dataclasses.replace(layer.attention.rope, scaling="none")
        init(self, config)

    Trainer.__init__ = __init__


def install(dump: str, load: str | None, no_yarn: bool) -> None:
    Trainer = _trainer_class()
    if no_yarn:
        without_yarn(Trainer)
    original = Trainer.forward_backward_step
    ref = None if load is None else torch.load(load, weights_only=True)
    record = {"batches": [], "loader_batches": [], "losses": []}

    def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
        model, step = self.model_parts[0], len(record["batches"])
        if step == 0:
            record["state"] = {k: v.detach().clone() for k, v in get_model_state_dict(model, options=FULL).items()}
        record["loader_batches"].append((input_dict, labels))
        if ref is not None:
            if step == 0:
                state = to_tt03(ref["state"])
                if set(state) != set(record["state"]):
                    raise KeyError(f"0.2 -> 0.3 names differ: {sorted(set(state) ^ set(record['state']))}")
                set_model_state_dict(model, state, options=FULL)
            input_dict, labels = ref["batches"][step]
        loss = original(self, input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens)
        if step == 0:
            record["grads"] = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                               for n, p in model.named_parameters() if p.grad is not None}
        record["batches"].append((input_dict, labels))
        record["losses"].append(loss.detach())
        torch.save(record, dump)
        return loss

    Trainer.forward_backward_step = forward_backward_step


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m scripts.step_dump", description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s DUMP [LOAD [--no-yarn]] -- <titan_fp4six.train arguments>")
    parser.add_argument("dump", help="where the record goes (torch.save, rewritten after every step)")
    parser.add_argument("load", nargs="?", help="a DUMP of a torchtitan 0.2.2 run: start from its weights and train "
                        "on its batches (under 0.3)")
    parser.add_argument("--no-yarn", action="store_true", help="with LOAD: RoPE scaling 'none', 0.2's attention")
    ours = parser.parse_args(argv[:split])
    if split == len(argv):
        parser.error("the trainer's arguments go after `--` (--job.config_file ... or --module ... --config ...)")
    if ours.no_yarn and ours.load is None:
        parser.error("--no-yarn goes with LOAD (a 0.2.2 run's DUMP)")
    sys.argv = [sys.argv[0], *argv[split + 1:]]  # torchtitan 0.2 binds sys.argv when its config module loads
    install(ours.dump, ours.load, ours.no_yarn)
    from titan_fp4six.train import main as train

    return train()


if __name__ == "__main__":
    sys.exit(main())
