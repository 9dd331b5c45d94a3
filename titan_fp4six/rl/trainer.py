"""GRPO trainer on torchtitan's pieces: its Trainer builds the model (train spec + 4/6 converters), parallelized
by torchtitan's own function for the recipe's [parallelism] (FSDP2, expert parallelism), optimizer, LR schedule,
checkpointer and metric loggers from the job config; `train()` runs RL steps instead of LM steps.

One step on each of the N ranks of a torchrun world (N = 1: one process): draw the step's prompts and sampling
seeds (the same on every rank), take this rank's groups (rl/distributed.py), sample them with the generator
(inference mode, expert weights quantized once per refresh), score them with the task, re-score every response
with the training forward (the same model, the kernels of the [rl] mode), log the trainer/rollout mismatch, and
take one clipped-ratio GRPO update over the global batch; then copy the new weights into the rollout engine.
The engine is the trainer's own model for the native generator on one process; otherwise a whole, unsharded
model of the same recipe on every rank (the native engine, or the model inside vLLM), filled by
rl/weight_sync.py.
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
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.protocols.model_converter import build_model_converters
from torchtitan.protocols.train_spec import get_train_spec
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from ..integration.dry_run import GIB
from ..integration.dump_lock import lock_dump_folder
from ..integration.nonfinite import check_finite, nonfinite_allowed
from ..train import check_before_training
from . import grpo
from .distributed import Ranks
from .experts import ExpertWeightCache, cached_experts
from .forward import forward, kernels, layout
from .generator import Rollout, generate, tempered
from .task import CopyTask, DatasetTask, Vocabulary
from .weight_sync import WeightSync

SUPPORTED_MODELS = ("qwen3",)
"""Model families whose modules rl/forward.py reads (Qwen3's attention: wq/wk/wv/wo, q_norm/k_norm, n_kv_heads)."""


def check_rl_job(job_config, engine: bool = True) -> CopyTask | DatasetTask:
    """The checks that need more than the [rl] section (which checks itself when the config loads), before
    torchtitan builds anything, on WORLD_SIZE ranks; returns the task. engine=False: not the generator's
    installation (a dry run plans for another machine)."""
    if getattr(job_config, "rl", None) is None:
        raise ValueError('python -m titan_fp4six.rl needs [job] custom_config_module = "titan_fp4six.rl.job_config"')
    check_before_training(job_config)
    cfg, name = job_config.rl, job_config.model.name
    if name not in SUPPORTED_MODELS:
        raise ValueError(f"titan_fp4six.rl supports model.name = {', '.join(map(repr, SUPPORTED_MODELS))} (its forward "
                         f"reads their modules); got model.name={name!r}")
    if cfg.generator == "vllm" and engine:
        from .vllm_generator import check_engine

        check_engine(get_train_spec(name).model_args[job_config.model.flavor], job_config.model.flavor,
                     not torch.cuda.is_available())
    world = int(os.environ.get("WORLD_SIZE", "1"))
    check_layout(job_config, world)
    task = _task(job_config)
    if cfg.engine_kv_cache_gib:
        from .vllm_generator import kv_cache_bytes

        args = get_train_spec(name).model_args[job_config.model.flavor]
        one = kv_cache_bytes(args, 1, task.max_positions(), engine_dtype(job_config, world))
        if cfg.engine_kv_cache_gib * GIB < one:
            raise ValueError(f"rl.engine_kv_cache_gib={cfg.engine_kv_cache_gib!r} holds less than one whole "
                             f"sequence of model.flavor={job_config.model.flavor!r} ({task.max_positions()} positions: "
                             f"{one / GIB:.3g} GiB); raise it or set 0 (one step's rollouts)")
    return task


def _task(job_config) -> CopyTask | DatasetTask:
    """The [rl] task, checked against training.seq_len (the model's RoPE table)."""
    cfg, seq_len = job_config.rl, job_config.training.seq_len
    if cfg.dataset:
        task = DatasetTask(cfg.dataset, cfg.reward, job_config.model.hf_assets_path, cfg.max_new_tokens)
        positions = task.max_positions()
        what = (f"rl.dataset={cfg.dataset!r}: its longest prompt ({positions - cfg.max_new_tokens} tokens) and "
                f"rl.max_new_tokens={cfg.max_new_tokens}")
        fix = f"shorten them or raise training.seq_len to {positions}"
    else:
        task = CopyTask(Vocabulary.from_tokenizer(job_config.model.hf_assets_path, cfg.alphabet), cfg.task_length)
        positions = task.max_positions()
        what = (f"rl.task_length={cfg.task_length}: a prompt ({cfg.task_length} + 2 tokens) and its response (up to "
                f"{task.max_new_tokens()})")
        fix = f"use rl.task_length <= {(seq_len - 3) // 2} or training.seq_len >= {positions}"
    if positions > seq_len:
        raise ValueError(f"{what} take {positions} positions, more than training.seq_len={seq_len} (the model's RoPE "
                         f"table); {fix}")
    return task


def check_layout(job_config, world: int) -> None:
    """The [parallelism] and [rl] layout on `world` ranks: data parallel (FSDP2) and expert parallel only, whole
    prompt groups per rank, and the consistent mode's FP32 weights."""
    p, cfg = job_config.parallelism, job_config.rl
    for key in ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree",
                "data_parallel_replicate_degree"):
        if getattr(p, key) != 1:
            raise ValueError(f"parallelism.{key}={getattr(p, key)}: titan_fp4six.rl shards its trainer with FSDP2 "
                             "(data_parallel_shard_degree) and expert parallelism (expert_parallel_degree) only; "
                             f"set parallelism.{key} = 1")
    if cfg.prompts_per_step % world:
        raise ValueError(f"rl.prompts_per_step={cfg.prompts_per_step} does not split over {world} ranks (each rank "
                         f"samples whole groups); use a multiple of {world}")
    args = get_train_spec(job_config.model.name).model_args[job_config.model.flavor]
    experts = getattr(getattr(args, "moe_args", None), "num_experts", None) if getattr(args, "moe_enabled", False) \
        else None
    ep = p.expert_parallel_degree
    if world % ep:
        raise ValueError(f"parallelism.expert_parallel_degree={ep} must divide the {world} ranks (expert parallelism "
                         "splits the FSDP2 ranks)")
    if ep > 1 and (experts is None or experts % ep):
        raise ValueError(f"parallelism.expert_parallel_degree={ep} must divide the routed experts of "
                         f"model.flavor={job_config.model.flavor!r} ({experts or 'none'})")
    if ep > 1 and cfg.consistent:
        raise ValueError(f"rl.consistent=true with parallelism.expert_parallel_degree={ep}: the consistent MoE routes "
                         "every token itself; use expert_parallel_degree = 1 (FSDP2 only) or the fast mode")
    if world > 1 and cfg.consistent and job_config.training.mixed_precision_param != "float32":
        raise ValueError(f"rl.consistent=true on {world} ranks needs training.mixed_precision_param = \"float32\" "
                         f"(got {job_config.training.mixed_precision_param!r}): FSDP2 hands the trainer's forward its "
                         "weights in that dtype, the consistent kernels and the engine compute in FP32")


def engine_dtype(job_config, world: int) -> torch.dtype:
    """The dtype the trainer's forward sees its weights in, which a rollout engine computes in: FSDP2's parameter
    dtype on N > 1 ranks (check_layout leaves FSDP2 the only data parallelism), else the parameters' own
    (training.dtype; AMP's autocast then casts inside the GEMMs, which an engine does not mimic)."""
    training = job_config.training
    return TORCH_DTYPE_MAP[training.mixed_precision_param if world > 1 else training.dtype]


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
        lock_dump_folder(job_config.job.dump_folder)  # two runs into one folder would mix checkpoints and metrics
        super().__init__(job_config)
        cfg = job_config.rl
        self.ranks = Ranks.current()
        self.rng = random.Random(cfg.seed)
        self.sampler = torch.Generator().manual_seed(cfg.seed)
        self.expert_cache = ExpertWeightCache()
        self.reference = None
        self.metrics_path = Path(job_config.job.dump_folder) / cfg.metrics_file
        self.rollouts_path = (Path(job_config.job.dump_folder) / cfg.rollouts_file.format(rank=self.ranks.rank)
                              if cfg.rollouts_file else None)
        self.vllm = None
        # the rollout engine: the trainer's own model (native, one process), or a whole model on every rank
        dtype = self._engine_dtype()
        if cfg.generator == "vllm":
            from .vllm_generator import VLLMGenerator

            self.vllm = VLLMGenerator(self._policy_copy, self.model_args, max_len=self.task.max_positions(),
                                      max_seqs=cfg.prompts_per_step * cfg.group_size // self.ranks.world,
                                      eos_id=self.task.eos, dtype=dtype, seed=cfg.seed,
                                      kv_bytes=int(cfg.engine_kv_cache_gib * GIB) or None)
            self.engine, self.engine_cache = self.vllm.model.titan, self.vllm.model.expert_cache
        elif self.ranks.world > 1:
            self.engine, self.engine_cache = self._policy_copy().requires_grad_(False), ExpertWeightCache()
        else:
            self.engine, self.engine_cache = self.model_parts[0], self.expert_cache
        self.sync = None
        if self.engine is not self.model_parts[0]:
            self.sync = WeightSync(self.engine, self.engine_cache, cfg.weight_sync,
                                   torch.float32 if cfg.consistent else dtype)

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
        """The KL reference policy: a frozen copy of the policy as it is now, sharded like it (FSDP2 modules do
        not deep-copy: built, converted and parallelized as torchtitan built the policy, then filled from it)."""
        policy = self.model_parts[0]
        if not self.parallel_dims.dp_shard_enabled and not self.parallel_dims.ep_enabled:
            return copy.deepcopy(policy).requires_grad_(False)
        with torch.device("meta"):
            ref = self.train_spec.model_cls(self.model_args)
        build_model_converters(self.job_config, self.parallel_dims).convert(ref)
        ref = self.train_spec.parallelize_fn(ref, self.parallel_dims, self.job_config)
        ref.to_empty(device=self.device)
        with torch.no_grad():
            ref.init_weights(buffer_device=None)
        ref.load_state_dict(policy.state_dict())
        return ref.requires_grad_(False)

    def _engine_dtype(self) -> torch.dtype:
        return engine_dtype(self.job_config, self.ranks.world)

    def _policy_copy(self):
        """The recipe's model built and converted again, whole (an engine's; weights come by the weight sync)."""
        return build_converted(self.job_config, self.device, self._engine_dtype())

    def _amp(self):
        """torchtitan's autocast for fast mode; the consistent kernels compute in FP32 themselves."""
        return contextlib.nullcontext() if self.job_config.rl.consistent else self.maybe_enable_amp

    def _sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def rollout(self, prompts, seeds) -> Rollout:
        cfg = self.job_config.rl
        sampling = dict(max_new_tokens=self.task.max_new_tokens(), stop_ids=(self.task.eos,),
                        pad_id=self.task.eos, temperature=cfg.temperature, top_p=cfg.top_p, seeds=seeds)
        if self.vllm is not None:
            return self.vllm.generate(prompts, **sampling)
        model = self.engine
        counts = {n: b.clone() for n, b in model.named_buffers() if n.endswith("tokens_per_expert")}
        ops = kernels(cfg.consistent, self.engine_cache)
        patch = contextlib.nullcontext() if cfg.consistent else cached_experts(model, self.engine_cache)
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
        batch = layout(seqs, self.task.eos, cfg.rescoring == "packed", self.device)
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
        unique = self.task.examples(cfg.prompts_per_step, self.rng)
        seeds = torch.randint(0, 2 ** 31 - 1, (cfg.prompts_per_step * cfg.group_size,), generator=self.sampler)
        mine = self.ranks.groups(cfg.prompts_per_step)
        examples = [e for e in unique[mine] for _ in range(cfg.group_size)]
        prompts = [e.tokens for e in examples]
        seeds = seeds[mine.start * cfg.group_size:mine.stop * cfg.group_size].tolist()
        lr = self.lr_schedulers.schedulers[0].get_last_lr()[0]

        start = self._sync()
        ro = self.rollout(prompts, seeds)
        generated = int(ro.mask.sum())
        gen_time = self._sync() - start
        rewards = torch.tensor([self.task.reward(e, ro.tokens[i][ro.mask[i]].tolist())
                                for i, e in enumerate(examples)])
        advantages = grpo.group_advantages(rewards, cfg.group_size).to(self.device)
        tokens = self.ranks.total(generated, self.device)
        if self.rollouts_path is not None:
            self._write_rollouts(mine.start * cfg.group_size, prompts, ro, rewards)

        start = self._sync()
        self.optimizers.zero_grad()
        logprobs, entropies = self.score(model, prompts, ro)
        metrics = grpo.mismatch(logprobs, ro.logprobs, ro.mask, tokens)
        ref = None
        if cfg.kl_coef > 0:
            if self.reference is None:
                raise RuntimeError("rl.kl_coef > 0 but no reference policy was built")
            with torch.no_grad():
                ref = self.score(self.reference, prompts, ro)[0]
        loss, stats = grpo.policy_loss(logprobs, ro.logprobs, advantages, ro.mask, cfg.clip_eps, cfg.kl_coef, ref,
                                       cfg.entropy_coef, entropies if cfg.entropy_coef > 0 else None, tokens)
        loss.backward()
        grad_norm = dist_utils.clip_grad_norm_([p for p in model.parameters()], self.job_config.training.max_norm,
                                               foreach=True, ep_enabled=self.parallel_dims.ep_enabled)
        self.optimizers.step()
        self.expert_cache.invalidate()
        self.lr_schedulers.step()
        train_time = self._sync() - start
        synced = self.sync_engine()
        trained = sum(len(p) for p in prompts) + generated
        metrics.update(stats)
        metrics.update({"loss": float(loss.detach()), "reward": float(rewards.sum()) / len(rewards) / self.ranks.world,
                        "trained_tokens": trained})
        metrics = self.ranks.reduce(metrics, {"mismatch_max": metrics.pop("mismatch_max"),
                                              "reward_max": float(rewards.max()), "gen_s": gen_time,
                                              "train_s": train_time, **synced}, self.device)
        trained = int(metrics.pop("trained_tokens"))
        self.ntokens_seen += trained
        flops = self.metrics_processor.num_flops_per_token
        metrics.update({"step": self.step, "grad_norm": float(grad_norm), "lr": lr, "response_tokens": tokens,
                        "gen_tps": tokens / metrics["gen_s"], "train_tps": trained / metrics["train_s"],
                        "mfu": 100 * flops * trained / metrics["train_s"] / self.ranks.world
                        / self.metrics_processor.gpu_peak_flops,
                        "consistent": cfg.consistent, "generator": cfg.generator, "ranks": self.ranks.world})
        return metrics

    def sync_engine(self) -> dict[str, float]:
        """The trainer's weights into the rollout engine (none to copy where the engine is the trainer's model)."""
        if self.sync is None:
            return {}
        start = self._sync()
        stats = self.sync(self.model_parts[0])
        return {"sync_s": self._sync() - start, "sync_packed_bytes": stats.packed,
                "sync_packed_bf16_bytes": stats.packed_bf16, "sync_whole_bytes": stats.whole}

    def log_step(self, metrics: dict) -> None:
        """Once, from rank 0 (every rank holds the reduced metrics)."""
        self.metrics_processor.logger.log({f"rl/{k}": v for k, v in metrics.items() if k != "step"}, self.step)
        if self.ranks.rank != 0:
            return
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self.metrics_processor.should_log(self.step):
            c = self.metrics_processor.color
            logger.info(f"{c.red}step: {self.step:2}  {c.green}reward: {metrics['reward']:.4f}  "
                        f"{c.orange}loss: {metrics['loss']:8.5f}  grad_norm: {metrics['grad_norm']:7.4f}  "
                        f"{c.turquoise}mismatch max: {metrics['mismatch_max']:.3e} mean: {metrics['mismatch_mean']:.3e} "
                        f"kl: {metrics['mismatch_kl']:.3e}  {c.blue}gen tps: {round(metrics['gen_tps']):,}  "
                        f"train tps: {round(metrics['train_tps']):,}  mfu: {metrics['mfu']:.2f}%{c.reset}")

    def _write_rollouts(self, first_row: int, prompts, ro: Rollout, rewards) -> None:
        with self.rollouts_path.open("a") as f:
            for i, p in enumerate(prompts):
                f.write(json.dumps({"step": self.step, "row": first_row + i, "prompt": p,
                                    "response": ro.tokens[i][ro.mask[i]].tolist(),
                                    "logprobs": ro.logprobs[i][ro.mask[i]].tolist(),
                                    "reward": float(rewards[i])}) + "\n")

    @staticmethod
    def _keep_lines_before(path: Path, step: int) -> None:
        """`path` (JSON lines with a "step") without the lines of `step` and later: a resumed run writes those
        steps again."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            return
        kept = []
        for line in path.read_text().splitlines(keepends=True):
            try:
                if json.loads(line)["step"] < step:
                    kept.append(line)
            except json.JSONDecodeError:  # the last line of a killed run, written in part
                continue
        path.write_text("".join(kept))

    def train(self):
        job_config = self.job_config
        self.checkpointer.load(step=job_config.checkpoint.load_step)
        self.sync_engine()
        if job_config.rl.kl_coef > 0 and (self.reference is None or self.step == 0):
            self.reference = self._reference_copy()  # a resumed run's was loaded with the checkpoint
        if self.ranks.rank == 0:
            self._keep_lines_before(self.metrics_path, self.step + 1)
        if self.rollouts_path is not None:
            self._keep_lines_before(self.rollouts_path, self.step + 1)
        logger.info(f"GRPO starts at step {self.step + 1} ({'consistent' if job_config.rl.consistent else 'fast'} "
                    f"kernels, {job_config.rl.generator} generator, {job_config.rl.prompts_per_step} prompts x "
                    f"{job_config.rl.group_size} samples on {self.ranks.world} rank(s))")
        while self.should_continue_training():
            self.step += 1
            self.gc_handler.run(self.step)
            metrics = self.rl_step()
            self.log_step(metrics)
            check_finite(self.step, metrics["loss"], metrics["grad_norm"], nonfinite_allowed(job_config.training))
            self.checkpointer.save(self.step, last_step=(self.step == job_config.training.steps))
        logger.info("Training completed")
