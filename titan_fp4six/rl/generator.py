"""Batched sampling from the model with a KV cache, in inference mode.

Prompts of different lengths are right-padded; each row writes its own next slot (= its RoPE position), so
a row's computation never sees another row's padding. Sampling: temperature, then top-p (nucleus) on the
sorted probabilities; the returned logprob of each token is under the distribution it was drawn from
(temperature and top-p applied, renormalized), i.e. the sampling policy. Greedy when temperature == 0 (the model's
logprob of the argmax is returned).
With top_p < 1 the trainer cannot re-score the truncation, so the mismatch then includes it.
Each row draws from its own generator, seeded by the caller (`seeds`, one per row, as vLLM takes a seed per
request): a row's sample depends on its prompt, its seed and the weights, not on which other rows share its
batch or on which rank generates it.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from ..quant.process_state import MAP4_STATS
from .forward import KVCache, forward


@dataclass
class Rollout:
    """tokens (B, max_new) generated ids (pad after a stop), logprobs (B, max_new) FP32 (0 after a stop),
    mask (B, max_new) bool: the tokens that belong to the response (the stop token included)."""

    tokens: Tensor
    logprobs: Tensor
    mask: Tensor


def tempered(logprobs: Tensor, temperature: float, log_softmax) -> Tensor:
    """The model's logprobs at `temperature` (unchanged, bit for bit, at 1 and for greedy decoding): what the
    trainer re-scores."""
    return logprobs if temperature in (0, 1) else log_softmax(logprobs.float() / temperature)


def row_generators(seeds: list[int], device) -> list[torch.Generator]:
    """One generator per row, seeded `seeds[i]`."""
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def sample(logprobs: Tensor, temperature: float, top_p: float, generators: list[torch.Generator] | None,
           log_softmax=None) -> tuple[Tensor, Tensor]:
    """logprobs (B, V) of the model -> (token (B,), its logprob under the sampling distribution (B,)); row i
    draws from generators[i] (None: the global generator).

    `log_softmax` renormalizes at temperature != 1 (the kernels' own, so the trainer can match it)."""
    if temperature == 0:  # greedy: report the model's logprob of the chosen token
        token = logprobs.argmax(-1)
        return token, logprobs.gather(-1, token[:, None]).squeeze(-1).float()
    logits = tempered(logprobs, temperature, log_softmax or (lambda x: torch.log_softmax(x, -1)))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        outside = probs.cumsum(-1) - probs >= top_p  # keeps the smallest prefix reaching top_p (>= 1 token)
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(outside, -torch.inf))
    policy = logits if top_p == 1.0 else torch.log_softmax(logits, dim=-1)
    probs = policy.exp()
    if generators is None:
        token = torch.multinomial(probs, 1).squeeze(-1)
    else:
        token = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])
    return token, policy.gather(-1, token[:, None]).squeeze(-1)


# rollouts do not count toward the training map-to-4 metric (whose counters must not be inference tensors)
@torch.inference_mode()
@MAP4_STATS.paused()
def generate(model, prompts: list[list[int]], *, max_new_tokens: int, ops, stop_ids: tuple[int, ...] = (),
             pad_id: int = 0, temperature: float = 1.0, top_p: float = 1.0,
             seeds: list[int] | None = None) -> Rollout:
    """Sample up to `max_new_tokens` after each prompt, row i from a generator seeded seeds[i] (None: torch's
    global generator); a row stops after emitting one of `stop_ids`."""
    if not prompts or min(len(p) for p in prompts) == 0:
        raise ValueError("generate needs at least one prompt, each with at least one token")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}; it must be >= 1")
    if not 0 < top_p <= 1 or temperature < 0:
        raise ValueError(f"top_p={top_p} must be in (0, 1] and temperature={temperature} >= 0")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts: one seed per prompt")
    device = model.tok_embeddings.weight.device
    generators = None if seeds is None else row_generators(seeds, device)
    batch, longest = len(prompts), max(len(p) for p in prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    tokens = torch.full((batch, longest), pad_id, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        tokens[i, :len(p)] = torch.tensor(p, device=device)
    dtype = ops.activation_dtype or (torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type)
                                     else model.tok_embeddings.weight.dtype)
    cache = KVCache.empty(model, batch, longest + max_new_tokens, dtype, device)
    positions = torch.arange(longest, device=device).expand(batch, -1)
    logprobs = forward(model, tokens, positions, ops, cache)
    step_lp = logprobs[torch.arange(batch, device=device), lengths - 1]
    out_tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    out_lp = torch.zeros(batch, max_new_tokens, device=device)
    mask = torch.zeros(batch, max_new_tokens, dtype=torch.bool, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    stops = torch.tensor(stop_ids, dtype=torch.long, device=device)
    for t in range(max_new_tokens):
        token, lp = sample(step_lp, temperature, top_p, generators, ops.log_softmax)
        out_tokens[:, t] = torch.where(alive, token, pad_id)
        out_lp[:, t] = torch.where(alive, lp, 0.0)
        mask[:, t] = alive
        alive = alive & ~torch.isin(token, stops)
        if t + 1 == max_new_tokens or not bool(alive.any()):
            break
        step_lp = forward(model, token[:, None], (lengths + t)[:, None], ops, cache)[:, 0]
    return Rollout(out_tokens, out_lp, mask)
