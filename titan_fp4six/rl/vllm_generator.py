"""Rollouts from an in-process vLLM engine (`[rl] generator = "vllm"`) whose model is the recipe's torchtitan model,
built and converted by the recipe's own converters, so the 4/6 Linears and experts run inside vLLM.

`VLLMModel` is the model class vLLM builds: a torchtitan Qwen3 model (from the trainer's builder) whose decoder
layers run through rl/forward.py's `decoder_layer` with vLLM's paged `Attention` as the attention core (vLLM
schedules, caches keys/values and samples). Its weights are the trainer's, copied in memory after every optimizer
step (rl/weight_sync.py: no checkpoint on disk), its experts as the trainer quantized them. The engine runs in
this process (VLLM_ENABLE_V1_MULTIPROCESSING=0: the model object is reached directly, and the builder needs no
pickling), prefix caching off (cached keys of an older policy would be reused after a weight update), and it
reports the logprobs of the distribution it sampled from (temperature and top-p applied: the sampling policy, as
the native generator does).

vLLM is imported only here and only when a VLLMGenerator is built: `scripts/setup_vllm.sh` makes `.venv-vllm`.
"""

import json
import os
import tempfile
import weakref
from pathlib import Path

import torch
from torch import nn

from ..integration.hf_config import qwen3_config
from ..quant.process_state import MAP4_STATS
from ..vllm_plugin import scalar_inductor_on_default_capability
from .experts import ExpertWeightCache, cached_experts
from .forward import decoder_layer, embed, kernels, logits_of
from .generator import Rollout
from .weight_sync import WeightSync

ARCHITECTURE = "TitanFp4sixQwen3ForCausalLM"
"""The architecture name the package registers in vLLM's ModelRegistry for VLLMModel."""

_pending_builder = None
"""() -> converted torchtitan model: set by VLLMGenerator while vLLM builds its model (in this process)."""
_built: "weakref.WeakValueDictionary[int, VLLMModel]" = weakref.WeakValueDictionary()


def import_vllm():
    """vLLM, or an error that names the knob and the set-up script."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the trainer's threads stay the trainer's
    if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        raise ValueError("rl.generator='vllm' runs the engine in this process: unset VLLM_ENABLE_V1_MULTIPROCESSING "
                         f"or set it to 0 (got {os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r})")
    scalar_inductor_on_default_capability()
    try:
        import vllm
    except ImportError as e:
        raise ValueError(f"rl.generator='vllm' needs vLLM ({e}): run `bash scripts/setup_vllm.sh` and launch with "
                         "`.venv-vllm/bin/python -m titan_fp4six.rl ...`, or use rl.generator='native'") from e
    return vllm


def check_engine(model_args, flavor: str, cpu: bool) -> None:
    """Before anything is built: vLLM imports, and on the CPU its attention takes the flavor's head_dim."""
    import_vllm()
    if cpu:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if model_args.head_dim not in sizes:
            raise ValueError(f"rl.generator='vllm': model.flavor={flavor!r} has head_dim={model_args.head_dim}, which "
                             f"vLLM's CPU attention does not take (valid: {sizes}); use another flavor (e.g. 'tiny') "
                             "or rl.generator='native'")


class VLLMModel(nn.Module):
    """The vLLM model interface (forward over vLLM's flattened tokens, compute_logits) around the converted
    torchtitan model; vLLM's dummy loader leaves its weights alone, the trainer's come by VLLMGenerator.load_weights."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        from vllm.model_executor.layers.attention import Attention

        if _pending_builder is None:
            raise RuntimeError(f"{ARCHITECTURE} is built by titan_fp4six.rl.vllm_generator.VLLMGenerator only")
        self.titan = _pending_builder()
        attns = [layer.attention for layer in self.titan.layers.values()]
        self.attn = nn.ModuleList(
            Attention(a.n_heads, a.head_dim, a.scaling, num_kv_heads=a.n_kv_heads, cache_config=vllm_config.cache_config,
                      prefix=f"{prefix}model.layers.{i}.self_attn.attn") for i, a in enumerate(attns))
        self.expert_cache = ExpertWeightCache()
        self.ops = kernels(False, self.expert_cache)
        _built[id(self)] = self

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embed(self.titan, self.ops, input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None) -> torch.Tensor:
        """input_ids, positions (T,): the tokens of every scheduled sequence, flattened -> hidden states (T, dim)."""
        h = (self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds)[None]
        t = h.shape[1]
        with cached_experts(self.titan, self.expert_cache), MAP4_STATS.paused():  # rollouts are not training steps
            for attn, layer in zip(self.attn, self.titan.layers.values()):
                def attend(q, k, v, attn=attn):
                    return attn(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)).view(1, t, -1)
                h = decoder_layer(layer, self.ops, h, self.titan.rope_cache, positions[None], attend)
        return h[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return logits_of(self.titan, self.ops, hidden_states).float()


def kv_cache_bytes(model_args, sequences: int, positions: int, dtype: torch.dtype) -> int:
    """Keys and values of `sequences` whole sequences of `positions` tokens, a quarter more for vLLM's block
    rounding: the engine's KV cache when [rl] engine_kv_cache_gib is 0 (vLLM's CPU default would take most of the
    machine's memory)."""
    a = model_args
    return sequences * positions * a.n_layers * 2 * a.n_kv_heads * a.head_dim * dtype.itemsize * 5 // 4


class VLLMGenerator:
    """An in-process vLLM engine over the converted model `build()` returns; `generate` has the native
    generator's arguments and returns its Rollout. `kv_bytes`: its KV cache (None: kv_cache_bytes of max_seqs
    sequences of max_len)."""

    def __init__(self, build, model_args, *, max_len: int, max_seqs: int, eos_id: int, dtype: torch.dtype,
                 seed: int, kv_bytes: int | None = None):
        global _pending_builder
        vllm = import_vllm()
        from vllm import ModelRegistry

        if ARCHITECTURE not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(ARCHITECTURE, VLLMModel)
        self._folder = tempfile.TemporaryDirectory(prefix="titan_fp4six_vllm_")
        # sizes, heads and positions for vLLM's bookkeeping; VLLMModel itself is built from the torchtitan model
        config = qwen3_config(model_args, architecture=ARCHITECTURE, max_positions=max_len, eos_id=eos_id,
                              bos_id=eos_id, dtype=str(dtype).removeprefix("torch."))
        Path(self._folder.name, "config.json").write_text(json.dumps(config))
        if kv_bytes is None:
            kv_bytes = kv_cache_bytes(model_args, max_seqs, max_len, dtype)
        _pending_builder = build
        before = set(_built)
        try:
            self.llm = vllm.LLM(model=self._folder.name, skip_tokenizer_init=True, load_format="dummy",
                                dtype=dtype, max_model_len=max_len, max_num_seqs=max_seqs, enforce_eager=True,
                                enable_prefix_caching=False, kv_cache_memory_bytes=max(kv_bytes, 1 << 24),
                                logprobs_mode="processed_logprobs", seed=seed)
        finally:
            _pending_builder = None
        models = [m for key, m in _built.items() if key not in before]
        if len(models) != 1:
            raise RuntimeError(f"vLLM built {len(models)} {ARCHITECTURE} models in this process; expected one (is "
                               "VLLM_ENABLE_V1_MULTIPROCESSING=0 set before vLLM was imported?)")
        self.model = models[0]
        self._sync = None

    def load_weights(self, model: nn.Module) -> None:
        """A trainer model's weights (whole or sharded) into the engine's, packed (rl/weight_sync.py)."""
        if self._sync is None:
            dtype = next(self.model.titan.parameters()).dtype
            self._sync = WeightSync(self.model.titan, self.model.expert_cache, "packed", dtype)
        self._sync(model)

    def shutdown(self) -> None:
        """Stop the engine while torch.distributed is still up: vLLM's own teardown destroys the process groups
        it joined (the trainer's default group among them)."""
        self.llm.llm_engine.engine_core.shutdown()
        self._folder.cleanup()

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, stop_ids: tuple[int, ...] = (),
                 pad_id: int = 0, temperature: float = 1.0, top_p: float = 1.0,
                 seeds: list[int] | None = None) -> Rollout:
        from vllm import SamplingParams

        seeds = [None] * len(prompts) if seeds is None else seeds
        params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                                 stop_token_ids=list(stop_ids), ignore_eos=True, logprobs=0, seed=s,
                                 detokenize=False) for s in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        tokens = torch.full((len(prompts), max_new_tokens), pad_id, dtype=torch.long)
        logprobs = torch.zeros((len(prompts), max_new_tokens), dtype=torch.float32)
        for i, out in enumerate(outputs):
            sample = out.outputs[0]
            n = len(sample.token_ids)
            tokens[i, :n] = torch.tensor(sample.token_ids)
            logprobs[i, :n] = torch.tensor([lp[t].logprob for t, lp in zip(sample.token_ids, sample.logprobs)])
        lengths = torch.tensor([len(o.outputs[0].token_ids) for o in outputs])
        mask = torch.arange(max_new_tokens)[None, :] < lengths[:, None]
        return Rollout(tokens, logprobs, mask)
