"""`[job] custom_config_module = "titan_fp4six.rl.job_config"`: the plugin's sections plus `[rl]`."""

from dataclasses import dataclass, field

from ..integration import job_config as _plugin


GENERATORS = ("native", "vllm")
WEIGHT_SYNCS = ("packed", "bf16")
RESCORINGS = ("padded", "packed")
MIN_TEMPERATURE = 1e-3
"""The lowest rl.temperature: the tempered logits (logprobs / temperature, FP32) must stay finite, and below it
sampling is the argmax to FP32's resolution anyway (1e-40 overflowed to inf/nan in multinomial)."""
VLLM_MIN_TEMPERATURE = 0.01
"""vLLM's SamplingParams raises a temperature below this to it (vllm/sampling_params.py: _MAX_TEMP, with a log
line only), while the trainer re-scores at the set one."""


@dataclass
class RL:
    generator: str = "native"
    """Who samples the rollouts: "native" (the package's KV-cache generator on the trainer's model) or "vllm" (an
    in-process vLLM engine running the recipe's converted model, weights copied in after each step; needs
    scripts/setup_vllm.sh)."""
    weight_sync: str = "packed"
    """How the trainer's weights reach a rollout engine after each step (vLLM, or the native generator on N > 1
    ranks): "packed" sends the converted experts as the rollout forward quantizes them (codes, scales, amaxes:
    0.28x the bf16 bytes; bitwise the whole weights' quantization in the engine's dtype, the trainer forward's
    on N > 1 ranks) and the rest whole; "bf16"
    sends every tensor whole and the engine quantizes its experts itself."""
    engine_kv_cache_gib: float = 0.0
    """The vLLM engine's KV cache on each rank, GiB; 0: one step's rollouts of that rank, whole (what a
    synchronous GRPO step needs). Checked at start-up to hold at least one whole sequence."""
    rescoring: str = "padded"
    """How the trainer lays out the rollouts it re-scores: "padded" (one right-padded row each) or "packed" (all
    in one row, a per-document causal mask, positions restarting per document: no padding computed; the same
    logprobs, bitwise in consistent mode)."""
    consistent: bool = False
    """Batch-invariant kernels on both sides (rollouts and re-scoring bit-identical for row-scaled 4/6);
    off = the model's own fast kernels."""
    prompts_per_step: int = 16
    """Distinct prompts per step; each is sampled group_size times."""
    group_size: int = 8
    """Samples per prompt (GRPO group)."""
    dataset: str = ""
    """A JSON-lines file of {"prompt": ..., "answer": ...} to draw prompts from (rl/task.py: DatasetTask);
    empty: the built-in copy task (task_length, alphabet)."""
    reward: str = ""
    """With a dataset: the reward function, "package.module:function", called as function(prompt, response,
    answer) -> float on text (the response decoded without its <eos>)."""
    max_new_tokens: int = 0
    """With a dataset: the longest response sampled, in tokens (the copy task's is task_length + 1)."""
    task_length: int = 3
    """Symbols to copy per prompt."""
    alphabet: str = "0123456789"
    """Single-character tokens of the embedded tokenizer the prompts are drawn from."""
    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus sampling; < 1 biases the importance ratio (the trainer re-scores the untruncated policy)."""
    clip_eps: float = 0.2
    """PPO/GRPO ratio clip."""
    kl_coef: float = 0.0
    """> 0 adds a KL penalty to a frozen copy of the initial policy (costs one more forward per step)."""
    entropy_coef: float = 0.0
    """> 0 adds this times the policy's entropy (full vocabulary, response tokens) to the objective: keeps a
    fresh policy from collapsing onto one symbol for every prompt before it learns the task (docs/rl.md)."""
    seed: int = 0
    """Seed of the prompt and sampling streams."""
    metrics_file: str = "rl_metrics.jsonl"
    """Per-step metrics as JSON lines, relative to job.dump_folder."""
    rollouts_file: str = ""
    """Every rollout as a JSON line (step, global row, prompt, response, logprobs, reward), relative to
    job.dump_folder, one file per rank: "{rank}" in the name stands for it (e.g. "rollouts/rank{rank}.jsonl");
    empty: none written."""

    def __post_init__(self):
        """Checked when the config loads, not at the first rollout."""
        if self.generator not in GENERATORS:
            raise ValueError(f"rl.generator={self.generator!r}; valid: {', '.join(map(repr, GENERATORS))}")
        if self.dataset or self.reward:
            from .task import read_dataset, reward_function

            if not (self.dataset and self.reward):
                raise ValueError(f"rl.dataset={self.dataset!r} and rl.reward={self.reward!r}: a dataset task needs "
                                 "both (the copy task, both empty, has its own reward)")
            read_dataset(self.dataset)
            reward_function(self.reward)
            if type(self.max_new_tokens) is not int or self.max_new_tokens < 1:
                raise ValueError(f"rl.max_new_tokens={self.max_new_tokens!r}: a dataset task needs the longest "
                                 "response, an integer >= 1")
        elif not self.alphabet:
            raise ValueError("rl.alphabet='': the copy task draws its prompts from these single-character tokens; "
                             "give at least one, e.g. '0123456789' (the default)")
        if self.rollouts_file and "{rank}" not in self.rollouts_file:
            raise ValueError(f"rl.rollouts_file={self.rollouts_file!r} must contain '{{rank}}' (one file per rank), "
                             "e.g. 'rollouts/rank{rank}.jsonl'; empty: no rollouts written")
        if not self.engine_kv_cache_gib >= 0:
            raise ValueError(f"rl.engine_kv_cache_gib={self.engine_kv_cache_gib!r}; it must be >= 0 (0: sized to one "
                             "step's rollouts)")
        if self.engine_kv_cache_gib and self.generator != "vllm":
            raise ValueError(f"rl.engine_kv_cache_gib={self.engine_kv_cache_gib!r} sizes the vLLM engine's KV cache; "
                             "the native generator allocates each batch's cache itself: drop it or set "
                             "rl.generator='vllm'")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"rl.weight_sync={self.weight_sync!r}; valid: {', '.join(map(repr, WEIGHT_SYNCS))}")
        if self.rescoring not in RESCORINGS:
            raise ValueError(f"rl.rescoring={self.rescoring!r}; valid: {', '.join(map(repr, RESCORINGS))}")
        if self.generator == "vllm" and self.consistent:
            raise ValueError("rl.consistent=true with rl.generator='vllm': the consistent mode's batch-invariant "
                             "kernels run in the native generator only (vLLM's attention and batching are its own); "
                             "use rl.generator='native' for zero-mismatch rollouts")
        for key, low in (("prompts_per_step", 1), ("group_size", 2), ("task_length", 1)):
            value = getattr(self, key)
            if type(value) is not int or value < low:
                why = " (advantages are relative to a prompt's group)" if key == "group_size" else ""
                raise ValueError(f"rl.{key}={value!r}; it must be an integer >= {low}{why}")
        if not self.temperature > 0:
            raise ValueError(f"rl.temperature={self.temperature!r}; it must be > 0 (1 samples the policy itself): at 0 "
                             "every sample of a group is the same greedy answer, so every advantage is 0 and only "
                             "the entropy bonus would train")
        if self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"rl.temperature={self.temperature!r}; use rl.temperature >= {MIN_TEMPERATURE}: the "
                             "tempered logits (logprobs / temperature) leave FP32's range below it, and sampling is "
                             "the argmax to FP32's resolution there anyway")
        if not (type(self.seed) is int and 0 <= self.seed < 2 ** 63):
            raise ValueError(f"rl.seed={self.seed!r}; it must be an integer in [0, 2**63) (it seeds torch.Generator)")
        if self.generator == "vllm" and self.temperature < VLLM_MIN_TEMPERATURE:
            raise ValueError(f"rl.temperature={self.temperature!r} with rl.generator='vllm': vLLM samples at "
                             f"{VLLM_MIN_TEMPERATURE} instead (it raises lower temperatures) while the trainer "
                             f"re-scores at {self.temperature!r}; use rl.temperature >= {VLLM_MIN_TEMPERATURE} or "
                             "rl.generator='native'")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rl.top_p={self.top_p!r}; it must be in (0, 1] (1: no nucleus truncation)")
        if not (self.clip_eps > 0 and self.kl_coef >= 0 and self.entropy_coef >= 0):
            raise ValueError(f"rl.clip_eps={self.clip_eps!r} must be > 0, rl.kl_coef={self.kl_coef!r} >= 0 and "
                             f"rl.entropy_coef={self.entropy_coef!r} >= 0")


@dataclass
class JobConfig(_plugin.JobConfig):
    rl: RL = field(default_factory=RL)
