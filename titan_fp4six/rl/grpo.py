"""GRPO math: group-relative advantages, the clipped importance-ratio loss, and trainer/rollout mismatch."""

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """rewards (P * G,), prompts' samples contiguous -> (r - group mean) / (group std + eps)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of rl.group_size={group_size}")
    r = rewards.view(-1, group_size).float()
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True, unbiased=False) + eps)).view(-1)


def entropy(logprobs: Tensor) -> Tensor:
    """Entropy (nats) of each distribution over the last axis of logprobs (..., V)."""
    return -(logprobs.exp() * logprobs).sum(-1)


def policy_loss(logprobs: Tensor, rollout_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip_eps: float,
                kl_coef: float = 0.0, ref_logprobs: Tensor | None = None, entropy_coef: float = 0.0,
                entropies: Tensor | None = None, tokens: int | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clipped surrogate (PPO/GRPO) over response tokens, averaged per token over the batch.

    `tokens`: the global batch's response tokens when this is one rank's share (None: this batch's). The loss
    and the statistics are then this share's sums over them, which add up over the ranks (as torchtitan
    normalizes its loss; its FSDP2 sums the gradients).

    logprobs (B, T) with grad (trainer), rollout_logprobs (B, T) of the sampling policy, advantages (B,),
    mask (B, T). The ratio is against the rollout's own logprobs, so any trainer/rollout mismatch shows up
    in it. Optional KL to a reference policy (k3 estimator) when kl_coef > 0; optional entropy bonus
    (entropies (B, T) of the trainer's distributions, with grad) when entropy_coef > 0."""
    mask = mask.float()
    norm = mask.sum().clamp(min=1) if tokens is None else torch.tensor(max(tokens, 1), dtype=mask.dtype,
                                                                        device=mask.device)
    ratio = torch.exp(logprobs - rollout_logprobs)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    per_token = -surrogate
    stats = {}
    if kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("rl.kl_coef > 0 needs reference logprobs")
        log_r = ref_logprobs - logprobs
        kl = torch.exp(log_r) - log_r - 1
        per_token = per_token + kl_coef * kl
        stats["kl_ref"] = float((kl.detach() * mask).sum() / norm)
    if entropies is not None:
        per_token = per_token - entropy_coef * entropies
        stats["entropy"] = float((entropies.detach() * mask).sum() / norm)
    elif entropy_coef > 0:
        raise ValueError("rl.entropy_coef > 0 needs the trainer's entropies")
    loss = (per_token * mask).sum() / norm
    clipped = ((ratio.detach() - 1).abs() > clip_eps).float()
    stats["clip_frac"] = float((clipped * mask).sum() / norm)
    return loss, stats


def mismatch(trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor,
             tokens: int | None = None) -> dict[str, float]:
    """max and mean |trainer - rollout| logprob over response tokens, and KL(rollout || trainer) (k3); with
    `tokens` (the global batch's response tokens) the mean and KL are this share's sums over them."""
    # float64: the k3 term of differences near FP32's resolution would round to 0 in FP32
    diff = (trainer_logprobs.detach().double() - rollout_logprobs.double())[mask]
    if diff.numel() == 0:
        return {"mismatch_max": 0.0, "mismatch_mean": 0.0, "mismatch_kl": 0.0}
    kl = torch.exp(diff) - diff - 1
    norm = diff.numel() if tokens is None else tokens
    return {"mismatch_max": float(diff.abs().max()), "mismatch_mean": float(diff.abs().sum() / norm),
            "mismatch_kl": float(kl.sum() / norm)}
