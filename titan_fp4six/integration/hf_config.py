"""The Hugging Face `config.json` of a torchtitan Qwen3 model (dense or MoE), the checks that the architecture
vLLM and transformers know computes what the torchtitan model computes, and a tokenizer folder's ids.

Used by the export (`titan_fp4six.export`: the real `Qwen3MoeForCausalLM` / `Qwen3ForCausalLM`) and by the RL
vLLM generator (the same sizes under the package's own registered architecture)."""

import json
from pathlib import Path


def tokenizer_ids(directory: str | Path) -> tuple[dict[str, int], int | None, int]:
    """(token -> id, the added tokens included, the bos id or None, the eos id) of a Hugging Face tokenizer folder
    (tokenizer.json and tokenizer_config.json). Qwen3's own config has "bos_token": null (no bos: None), and
    tokens may be AddedToken objects ({"content": ...}); an eos is required."""
    directory = Path(directory)
    data = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab = dict(data["model"]["vocab"])
    vocab.update({t["content"]: t["id"] for t in data.get("added_tokens", [])})
    ids = []
    for key in ("bos_token", "eos_token"):
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if token is None and key == "bos_token":
            ids.append(None)
        elif isinstance(token, str) and token in vocab:
            ids.append(vocab[token])
        else:
            raise ValueError(f"{directory / 'tokenizer_config.json'}: {key}={config.get(key)!r} is not a token of "
                             f"{directory / 'tokenizer.json'}{' (an eos token is required)' if token is None else ''}")
    return vocab, ids[0], ids[1]


def check_hf_equivalent(model_name: str, model_args) -> None:
    """Refuse a model the Hugging Face Qwen3 classes would compute differently, naming what differs."""
    if model_name != "qwen3":
        raise ValueError(f"model.name={model_name!r}: the Hugging Face export supports 'qwen3' (dense and MoE)")
    if not model_args.moe_enabled:
        return
    m = model_args.moe_args
    differs = {"moe_args.num_shared_experts": (m.num_shared_experts, 0), "moe_args.score_func": (m.score_func, "softmax"),
               "moe_args.score_before_experts": (m.score_before_experts, False),
               "moe_args.route_scale": (m.route_scale, 1.0)}
    bad = {k: v for k, (v, want) in differs.items() if v != want}
    if bad:
        raise ValueError(f"Hugging Face Qwen3-MoE routes with softmax, top-k weights applied after the experts, no "
                         f"shared experts and no route scale; this flavor has {bad}")


def qwen3_config(model_args, *, architecture: str | None, max_positions: int, eos_id: int, bos_id: int,
                 dtype: str) -> dict:
    """config.json of Qwen3 (dense) or Qwen3-MoE with the torchtitan model args' sizes; architecture None: the
    Hugging Face class (Qwen3ForCausalLM / Qwen3MoeForCausalLM)."""
    a = model_args
    moe = a.moe_enabled
    config = {"architectures": [architecture or ("Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM")],
              "model_type": "qwen3_moe" if moe else "qwen3", "vocab_size": a.vocab_size, "hidden_size": a.dim,
              "intermediate_size": a.hidden_dim, "num_hidden_layers": a.n_layers,
              "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_kv_heads, "head_dim": a.head_dim,
              "rms_norm_eps": a.norm_eps, "rope_theta": a.rope_theta, "max_position_embeddings": max_positions,
              "tie_word_embeddings": a.enable_weight_tying, "attention_bias": False, "hidden_act": "silu",
              "eos_token_id": eos_id, "bos_token_id": bos_id, "torch_dtype": dtype}
    if moe:
        config.update(moe_intermediate_size=a.moe_inter_dim, num_experts=a.moe_args.num_experts,
                      num_experts_per_tok=a.moe_args.top_k, norm_topk_prob=a.moe_args.route_norm,
                      decoder_sparse_step=1, mlp_only_layers=[])
    return config
