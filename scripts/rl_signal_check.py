"""Is the copy task learnable from its reward? Supervised vs policy-gradient updates of a fresh model, on the CPU.

    python -m scripts.rl_signal_check --mode supervised   # cross-entropy on the right symbol
    python -m scripts.rl_signal_check --mode grpo         # sampled answers, group-relative advantages
    python -m scripts.rl_signal_check --mode baseline     # sampled answers, batch-mean baseline
    python -m scripts.rl_signal_check --mode grpo --entropy-coef 0.01   # plus the trainer's entropy bonus

One-symbol copy task (`<bos> s =` -> `s`) from the embedded tokenizer, the model's own forward
(titan_fp4six.rl.forward, fast kernels) on the prompt only, no generator or trainer: what it isolates is the
learning signal. Prints the mean reward and the greedy copy accuracy (chance: 1 / len(alphabet)) every 5 steps.
`--flavor tiny` is the package's 2-layer flavor (titan_fp4six/integration/flavors.py); `debugmodel_moe` the recipe's.
"""

import argparse
import copy
import random

import torch
from torchtitan.protocols.train_spec import get_train_spec

from titan_fp4six.integration import flavors  # noqa: F401  (registers the "tiny" flavor)
from titan_fp4six.integration.cpu import apply as cpu_patches
from titan_fp4six.rl import grpo
from titan_fp4six.rl.forward import forward, kernels
from titan_fp4six.rl.task import CopyTask, Vocabulary

EMBEDDED = "titan_fp4six/integration/embedded"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("supervised", "grpo", "baseline"), required=True)
    p.add_argument("--flavor", default="tiny")
    p.add_argument("--alphabet", default="0123")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--entropy-coef", type=float, default=0.0)
    args = p.parse_args()
    cpu_patches()
    torch.manual_seed(0)
    spec = get_train_spec("qwen3")
    model_args = copy.deepcopy(spec.model_args[args.flavor])
    model_args.moe_args.use_grouped_mm = False  # CPU
    model = spec.model_cls(model_args)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    task = CopyTask(Vocabulary.from_tokenizer(EMBEDDED, args.alphabet), 1)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng, ops = random.Random(0), kernels(False)
    for step in range(args.steps):
        prompts = [q for q in task.prompts(args.prompts, rng) for _ in range(args.group_size)]
        tokens = torch.tensor(prompts)
        logprobs = forward(model, tokens, torch.arange(tokens.shape[1]).expand(len(prompts), -1), ops)[:, -1]
        if args.mode == "supervised":
            answers, weights = tokens[:, 1], torch.ones(len(prompts))
        else:
            answers = torch.multinomial(logprobs.detach().exp(), 1).squeeze(-1)
        rewards = torch.tensor([task.reward(q, [int(a)]) for q, a in zip(prompts, answers)])
        if args.mode == "grpo":
            weights = grpo.group_advantages(rewards, args.group_size)
        elif args.mode == "baseline":
            weights = rewards - rewards.mean()
        loss = -(weights * logprobs.gather(-1, answers[:, None]).squeeze(-1)).mean()
        loss = loss - args.entropy_coef * grpo.entropy(logprobs).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 5 == 0 or step == args.steps - 1:
            accuracy = (logprobs.argmax(-1) == tokens[:, 1]).float().mean()
            print(f"step {step:4d}  reward {float(rewards.mean()):.3f}  greedy copy accuracy {float(accuracy):.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
