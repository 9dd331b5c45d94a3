"""Trainer/rollout mismatch of the three rollout paths, on the CPU, for docs/results/rl.md's generator table:

    .venv-vllm/bin/python -m scripts.rl_generators [--seeds 5] [--json OUT.json] [--docs]

The RL recipe's model (configs/rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml at the `tiny` flavor, FP32, built
and converted by the recipe's converters) is first taught the copy task by teacher forcing (so its logprobs are
far from uniform: a near-uniform policy hides mismatch), once per activation scaling (row: the RL base point;
tensor: per-tensor amaxes, as the all-Linears recipes use). Then, per seed, the same prompts are rolled out by the
native generator in fast mode, the native generator in consistent mode and the vLLM engine, and each rollout is
re-scored by the trainer's forward in the matching mode; the table gives the mean over seeds of the max and mean
|logp difference| and the k3 KL over response tokens, with a 95% t-interval. --docs writes the table into its
section ("rl-generators") of docs/results/rl.md.
"""

import argparse
import json
import random
import sys
from pathlib import Path

import torch
from torchtitan.config.manager import ConfigManager
from torchtitan.protocols.train_spec import get_train_spec

from scripts.results_page import DOCS_HELP, command_line, write_section
from titan_fp4six.compare.stats import mean_interval
from titan_fp4six.integration import cpu
from titan_fp4six.rl import grpo
from titan_fp4six.rl.experts import ExpertWeightCache, cached_experts
from titan_fp4six.rl.forward import forward, kernels, layout
from titan_fp4six.rl.generator import generate
from titan_fp4six.rl.task import CopyTask, Vocabulary
from titan_fp4six.rl.trainer import build_converted
from titan_fp4six.rl.vllm_generator import VLLMGenerator

RECIPE = "configs/rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml"
PROMPTS, GROUP = 16, 4


def job(scaling: str):
    return ConfigManager().parse_args(["--job.config_file", RECIPE, "--model.flavor", "tiny",
                                       "--training.mixed_precision_param", "float32",
                                       "--quantize.grouped_mm.four_over_six.activation_scaling", scaling])


def teach(model, task: CopyTask, steps: int, seed: int) -> float:
    """Teacher-forced copy task (the response and <eos> after each prompt); returns the last loss."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        prompts = [e.tokens for e in task.examples(32, rng)]
        seqs = torch.tensor([p + p[1:1 + task.length] + [task.vocab.eos] for p in prompts])
        positions = torch.arange(seqs.shape[1]).expand(seqs.shape[0], -1)
        logprobs = forward(model, seqs[:, :-1], positions[:, :-1], kernels(False))
        start = task.length + 1  # the "=" predicts the first copied symbol
        picked = logprobs[:, start:].gather(-1, seqs[:, start + 1:, None]).squeeze(-1)
        loss = -picked.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss)


def rescore(model, prompts, ro, consistent: bool) -> torch.Tensor:
    """The trainer's logprob of each rollout token (right-padded re-scoring, the trainer's default)."""
    seqs = [p + ro.tokens[i][ro.mask[i]].tolist() for i, p in enumerate(prompts)]
    b = layout(seqs, pad_id=0, packed=False, device="cpu")
    with torch.no_grad():
        lp = forward(model, b.tokens, b.positions, kernels(consistent))
    out = torch.zeros_like(ro.logprobs)
    for i, p in enumerate(prompts):
        n = int(ro.mask[i].sum())
        out[i, :n] = lp[i, len(p) - 1 + torch.arange(n), ro.tokens[i, :n]]
    return out


def measure(scaling: str, seeds: int, teach_steps: int) -> dict:
    cfg = job(scaling)
    task = CopyTask(Vocabulary.from_tokenizer(cfg.model.hf_assets_path, cfg.rl.alphabet), cfg.rl.task_length)
    torch.manual_seed(0)
    model = build_converted(cfg, "cpu", torch.float32)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    loss = teach(model, task, teach_steps, seed=0)
    args = get_train_spec(cfg.model.name).model_args[cfg.model.flavor]
    vllm = VLLMGenerator(lambda: build_converted(cfg, "cpu", torch.float32), args, max_len=cfg.training.seq_len,
                         max_seqs=PROMPTS * GROUP, eos_id=task.vocab.eos, dtype=torch.float32, seed=0)
    vllm.load_weights(model)
    rows = {name: [] for name in ("native fast", "native consistent", "vLLM")}
    rewards = []
    sampling = dict(max_new_tokens=task.max_new_tokens(), stop_ids=(task.vocab.eos,), pad_id=task.vocab.eos)
    for seed in range(seeds):
        examples = [e for e in task.examples(PROMPTS, random.Random(100 + seed)) for _ in range(GROUP)]
        prompts = [e.tokens for e in examples]
        for name in rows:
            gen = torch.Generator().manual_seed(seed)
            sampling["seeds"] = torch.randint(0, 2 ** 31 - 1, (len(prompts),), generator=gen).tolist()
            if name == "vLLM":
                ro = vllm.generate(prompts, **sampling)
            else:
                cache = ExpertWeightCache()
                consistent = name == "native consistent"
                with cached_experts(model, cache) if not consistent else torch.no_grad():
                    ro = generate(model, prompts, ops=kernels(consistent, cache), **sampling)
            m = grpo.mismatch(rescore(model, prompts, ro, name == "native consistent"), ro.logprobs, ro.mask)
            m["logp"] = float(ro.logprobs[ro.mask].mean())
            rows[name].append(m)
            if name == "vLLM":
                rewards.append(sum(task.reward(e, ro.tokens[i][ro.mask[i]].tolist()) for i, e in enumerate(examples))
                               / len(prompts))
    vllm.shutdown()
    return {"teach_loss": loss, "reward": sum(rewards) / len(rewards), "rows": rows}


def _interval(e) -> str:
    return f"{e.mean:.2e}" if e.low is None else f"{e.mean:.2e} [{e.low:.2e}, {e.high:.2e}]"


def table(results: dict, seeds: int) -> str:
    """The generator table (mean [95% t-interval] over seeds; one seed: the mean alone) and a line per scaling."""
    lines = ["| activation scaling | generator | max \\|dlogp\\| | mean \\|dlogp\\| | k3 KL | mean rollout logp |",
             "| --- | --- | --- | --- | --- | --- |"]
    for scaling, r in results.items():
        for name, ms in r["rows"].items():
            cols = [_interval(mean_interval([m[k] for m in ms])) for k in ("mismatch_max", "mismatch_mean",
                                                                           "mismatch_kl")]
            lines.append(f"| {scaling} | {name} | {' | '.join(cols)} | {sum(m['logp'] for m in ms) / len(ms):.3f} |")
    lines.append("")
    for scaling, r in results.items():
        lines.append(f"- {scaling}: teacher-forced loss {r['teach_loss']:.3f}, vLLM rollout reward {r['reward']:.3f}, "
                     f"{seeds} seeds x {PROMPTS * GROUP} rollouts")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--teach-steps", type=int, default=20)
    parser.add_argument("--json")
    parser.add_argument("--docs", action="store_true", help=DOCS_HELP + " (rl.md, section rl-generators)")
    a = parser.parse_args()
    cpu.apply()
    results = {s: measure(s, a.seeds, a.teach_steps) for s in ("row", "tensor")}
    text = table(results, a.seeds)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    if a.docs:
        command = command_line()
        if Path(sys.prefix).name == ".venv-vllm":  # the environment it needs, as the user types it
            command = command.replace("python", ".venv-vllm/bin/python", 1)
        write_section("rl.md", "rl-generators", text, command=command)


if __name__ == "__main__":
    main()
