"""GRPO trainer on torchtitan's pieces: its Trainer builds the model (train spec + 4/6 converters), optimizer,
LR schedule, checkpointer and metric loggers from the job config; `train()` runs RL steps instead of LM steps.

One step: sample rollouts with the generator (inference mode, expert weights quantized once per refresh),
score them with the task, re-score every response with the training forward (the same model, the kernels of
the [rl] mode), log the trainer/rollout mismatch, and take one clipped-ratio GRPO update. Single device.
"""

import contextlib
import copy
import json
import os
import random
import time
from pathlib import Path

import torch
from torchtitan.distributed import utils as dist_utils
from torchtitan.protocols.model_converter import build_model_converters
from torchtitan.protocols.train_spec import get_train_spec
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from ..integration.nonfinite import check_finite, nonfinite_allowed
from ..train import check_before_training
from . import grpo
from .experts import ExpertWeightCache, cached_experts
from .forward import forward, kernels, layout
from .generator import Rollout, generate, tempered
from .task import CopyTask, Vocabulary

SUPPORTED_MODELS = ("qwen3",)
"""Model families whose modules rl/forward.py reads (Qwen3's attention: wq/wk/wv/wo, q_norm/k_norm, n_kv_heads)."""


def check_rl_job(job_config) -> CopyTask:
    """The checks that need more than the [rl] section (which checks itself when the config loads), before
    torchtitan builds anything; returns the task."""
    if getattr(job_config, "rl", None) is None:
        raise ValueError('python -m titan_fp4six.rl needs [job] custom_config_module = "titan_fp4six.rl.job_config"')
    check_before_training(job_config)
    cfg, name = job_config.rl, job_config.model.name
    if name not in SUPPORTED_MODELS:
        raise ValueError(f"titan_fp4six.rl supports model.name = {', '.join(map(repr, SUPPORTED_MODELS))} (its forward "
                         f"reads their modules); got model.name={name!r}")
    if cfg.generator == "vllm":
        from .vllm_generator import check_engine

        check_engine(get_train_spec(name).model_args[job_config.model.flavor], job_config.model.flavor,
                     not torch.cuda.is_available())
    world = int(os.environ["WORLD_SIZE"])
    if world != 1:
        raise ValueError(f"titan_fp4six.rl runs on one device; got WORLD_SIZE={world}: launch one process")
    task = CopyTask(Vocabulary.from_tokenizer(job_config.model.hf_assets_path, cfg.alphabet), cfg.task_length)
    positions = task.max_positions()
    if positions > job_config.training.seq_len:
        raise ValueError(f"rl.task_length={cfg.task_length}: a prompt ({cfg.task_length} + 2 tokens) and its response "
                         f"(up to {task.max_new_tokens()}) take {positions} positions, more than training.seq_len="
                         f"{job_config.training.seq_len} (the model's RoPE table); use rl.task_length <= "
                         f"{(job_config.training.seq_len - 3) // 2} or training.seq_len >= {positions}")
    return task


def build_converted(job_config, device, dtype, parallel_dims=None):
    """The recipe's model (train spec, flavor) on `device`, converted by the recipe's converters, in `dtype`
    (weights as the modules' constructors leave them: load your own)."""
    spec = get_train_spec(job_config.model.name)
    args = spec.model_args[job_config.model.flavor]
    args.update_from_config(job_config)
    with torch.device(device):
        model = spec.model_cls(args)
    build_model_converters(job_config, parallel_dims).convert(model)
    return model.to(dtype)


class RLTrainer(Trainer):
    def __init__(self, job_config):
        self.task = check_rl_job(job_config)
        super().__init__(job_config)
        cfg = job_config.rl
        self.rng = random.Random(cfg.seed)
        self.sampler = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self.expert_cache = ExpertWeightCache()
        self.reference = None
        self.metrics_path = Path(job_config.job.dump_folder) / cfg.metrics_file
        self.vllm = None
        if cfg.generator == "vllm":
            from .vllm_generator import VLLMGenerator

            dtype = next(self.model_parts[0].parameters()).dtype
            self.vllm = VLLMGenerator(self._policy_copy, self.model_args, max_len=job_config.training.seq_len,
                                      max_seqs=cfg.prompts_per_step * cfg.group_size, eos_id=self.task.vocab.eos,
                                      dtype=dtype, seed=cfg.seed)

    def close(self) -> None:
        if getattr(self, "vllm", None) is not None:
            self.vllm.shutdown()
            self.vllm = None
        super().close()

    def state_dict(self) -> dict:
        """torchtitan's train state plus what makes a resumed GRPO run equal an uninterrupted one: the prompt RNG
        (its Mersenne Twister words as a tensor: DCP fills fixed-shape tensors in place), the sampling
        generator and, with rl.kl_coef > 0, the KL reference policy (a copy of the policy filled in place when
        a checkpoint is loaded into it)."""
        version, words, gauss = self.rng.getstate()
        if version != 3 or gauss is not None:
            raise RuntimeError(f"random.Random state version {version} with a cached gauss value: not checkpointable")
        state = super().state_dict()
        state["rl_prompt_rng"] = torch.tensor(words, dtype=torch.int64)
        state["rl_sampler"] = self.sampler.get_state()
        if self.job_config.rl.kl_coef > 0:
            if self.reference is None:  # a checkpoint is being loaded: the template it fills
                self.reference = self._reference_copy()
            state["rl_reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.rng.setstate((3, tuple(int(w) for w in state["rl_prompt_rng"].tolist()), None))
        self.sampler.set_state(state["rl_sampler"])

    def _reference_copy(self):
        """The KL reference policy: a frozen copy of the policy as it is now."""
        return copy.deepcopy(self.model_parts[0]).requires_grad_(False)

    def _policy_copy(self):
        """The recipe's model built and converted again (for the vLLM engine; weights come by load_weights)."""
        return build_converted(self.job_config, self.device, next(self.model_parts[0].parameters()).dtype,
                               self.parallel_dims)

    def _amp(self):
        """torchtitan's autocast for fast mode; the consistent kernels compute in FP32 themselves."""
        return contextlib.nullcontext() if self.job_config.rl.consistent else self.maybe_enable_amp

    def _sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def rollout(self, model, prompts) -> Rollout:
        cfg = self.job_config.rl
        sampling = dict(max_new_tokens=self.task.max_new_tokens(), stop_ids=(self.task.vocab.eos,),
                        pad_id=self.task.vocab.eos, temperature=cfg.temperature, top_p=cfg.top_p,
                        generator=self.sampler)
        if self.vllm is not None:
            return self.vllm.generate(prompts, **sampling)
        counts = {n: b.clone() for n, b in model.named_buffers() if n.endswith("tokens_per_expert")}
        ops = kernels(cfg.consistent, self.expert_cache)
        patch = contextlib.nullcontext() if cfg.consistent else cached_experts(model, self.expert_cache)
        with self._amp(), patch:
            out = generate(model, prompts, ops=ops, **sampling)
        for name, buf in model.named_buffers():  # rollouts do not count toward expert load balancing
            if name in counts:
                buf.copy_(counts[name])
        return Rollout(out.tokens.clone(), out.logprobs.clone(), out.mask.clone())

    def score(self, model, prompts, ro: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """Trainer logprobs (B, max_new) of each rollout token and the entropy (B, max_new) of the distribution
        it was drawn from: every whole sequence in one forward, right-padded rows or packed (rl.rescoring)."""
        cfg = self.job_config.rl
        seqs = [p + ro.tokens[i][ro.mask[i]].tolist() for i, p in enumerate(prompts)]
        batch = layout(seqs, self.task.vocab.eos, cfg.rescoring == "packed", self.device)
        ops = kernels(cfg.consistent)
        with self._amp():
            logprobs = forward(model, batch.tokens, batch.positions, ops, documents=batch.documents)
        steps = ro.tokens.shape[1]
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        # past a response's end the columns repeat its last one (masked out of every statistic)
        ends = batch.col + torch.tensor([len(s) for s in seqs], device=self.device) - 1
        cols = torch.minimum(batch.col[:, None] + lengths[:, None] - 1 + torch.arange(steps, device=self.device),
                             ends[:, None])
        picked = tempered(logprobs[batch.row[:, None], cols], cfg.temperature, ops.log_softmax)
        return picked.gather(-1, ro.tokens.to(self.device)[..., None]).squeeze(-1), grpo.entropy(picked)

    def rl_step(self) -> dict:
        cfg = self.job_config.rl
        model = self.model_parts[0]
        unique = self.task.prompts(cfg.prompts_per_step, self.rng)
        prompts = [p for p in unique for _ in range(cfg.group_size)]
        lr = self.lr_schedulers.schedulers[0].get_last_lr()[0]

        start = self._sync()
        ro = self.rollout(model, prompts)
        generated = int(ro.mask.sum())
        gen_time = self._sync() - start
        rewards = torch.tensor([self.task.reward(p, ro.tokens[i][ro.mask[i]].tolist())
                                for i, p in enumerate(prompts)])
        advantages = grpo.group_advantages(rewards, cfg.group_size).to(self.device)

        start = self._sync()
        self.optimizers.zero_grad()
        logprobs, entropies = self.score(model, prompts, ro)
        metrics = grpo.mismatch(logprobs, ro.logprobs, ro.mask)
        ref = None
        if cfg.kl_coef > 0:
            if self.reference is None:
                raise RuntimeError("rl.kl_coef > 0 but no reference policy was built")
            with torch.no_grad():
                ref = self.score(self.reference, prompts, ro)[0]
        loss, stats = grpo.policy_loss(logprobs, ro.logprobs, advantages, ro.mask, cfg.clip_eps, cfg.kl_coef, ref,
                                       cfg.entropy_coef, entropies if cfg.entropy_coef > 0 else None)
        loss.backward()
        grad_norm = dist_utils.clip_grad_norm_([p for p in model.parameters()], self.job_config.training.max_norm,
                                               foreach=True)
        self.optimizers.step()
        self.expert_cache.invalidate()
        if self.vllm is not None:
            self.vllm.load_weights(model)
        self.lr_schedulers.step()
        train_time = self._sync() - start
        trained = sum(len(p) for p in prompts) + generated
        self.ntokens_seen += trained
        metrics.update(stats)
        metrics.update({"step": self.step, "loss": float(loss.detach()), "reward": float(rewards.mean()),
                        "reward_max": float(rewards.max()), "grad_norm": float(grad_norm), "lr": lr,
                        "response_tokens": generated, "gen_tps": generated / gen_time,
                        "train_tps": trained / train_time, "gen_s": gen_time, "train_s": train_time,
                        "consistent": cfg.consistent, "generator": cfg.generator})
        return metrics

    def log_step(self, metrics: dict) -> None:
        self.metrics_processor.logger.log({f"rl/{k}": v for k, v in metrics.items() if k != "step"}, self.step)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self.metrics_processor.should_log(self.step):
            c = self.metrics_processor.color
            logger.info(f"{c.red}step: {self.step:2}  {c.green}reward: {metrics['reward']:.4f}  "
                        f"{c.orange}loss: {metrics['loss']:8.5f}  grad_norm: {metrics['grad_norm']:7.4f}  "
                        f"{c.turquoise}mismatch max: {metrics['mismatch_max']:.3e} mean: {metrics['mismatch_mean']:.3e} "
                        f"kl: {metrics['mismatch_kl']:.3e}  {c.blue}gen tps: {round(metrics['gen_tps']):,}  "
                        f"train tps: {round(metrics['train_tps']):,}{c.reset}")

    def train(self):
        job_config = self.job_config
        self.checkpointer.load(step=job_config.checkpoint.load_step)
        if self.vllm is not None:
            self.vllm.load_weights(self.model_parts[0])
        if job_config.rl.kl_coef > 0 and (self.reference is None or self.step == 0):
            self.reference = self._reference_copy()  # a resumed run's was loaded with the checkpoint
        self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        if self.step == 0 and self.metrics_path.exists():
            os.remove(self.metrics_path)
        logger.info(f"GRPO starts at step {self.step + 1} ({'consistent' if job_config.rl.consistent else 'fast'} "
                    f"kernels, {job_config.rl.generator} generator, {job_config.rl.prompts_per_step} prompts x "
                    f"{job_config.rl.group_size} samples)")
        while self.should_continue_training():
            self.step += 1
            self.gc_handler.run(self.step)
            metrics = self.rl_step()
            self.log_step(metrics)
            check_finite(self.step, metrics["loss"], metrics["grad_norm"], nonfinite_allowed(job_config.training))
            self.checkpointer.save(self.step, last_step=(self.step == job_config.training.steps))
        logger.info("Training completed")
