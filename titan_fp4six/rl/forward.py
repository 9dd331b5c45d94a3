"""The Qwen3 (torchtitan) model's forward with per-row positions, a KV cache and two kernel sets.

torchtitan's own forward has neither a KV cache nor padding masks, so rollouts and the trainer's re-scoring
both run this one, which reads the model's modules (tok_embeddings, layers.*.attention.{wq,wk,wv,wo,q_norm,
k_norm}, attention_norm, ffn_norm, moe or feed_forward, norm, output, rope_cache) and calls them:
- fast mode: the modules themselves (converted 4/6 Linears and experts included), SDPA with a boolean mask;
- consistent mode: the same weights through the batch-invariant kernels of `consistent` (FP32).
Slot convention: a token's RoPE position is its cache slot; sequences are right-padded, so padding sits after
each row's real tokens and causality alone keeps it out of every real query.
Every stage runs inside its module's own call (`through`): the model, the embedding, each decoder layer, the final
norm and the LM head, so hooks a wrapper put there run around it (FSDP2's all-gather and reshard of a sharded
trainer, expert parallelism's dispatch).
"""

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from . import consistent
from .experts import ExpertWeightCache, consistent_moe


@dataclass
class KVCache:
    """Per layer (B, n_kv_heads, slots, head_dim) keys and values; unwritten slots hold zeros."""

    k: list[Tensor]
    v: list[Tensor]

    @classmethod
    def empty(cls, model, batch: int, slots: int, dtype, device) -> "KVCache":
        attn = next(iter(model.layers.values())).attention
        shape = (batch, attn.n_kv_heads, slots, attn.head_dim)
        n = len(model.layers)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n)])


def _rope(x: Tensor, rope_cache: Tensor, positions: Tensor) -> Tensor:
    """torchtitan's rotate-half RoPE at per-row positions: x (B, T, H, D), positions (B, T)."""
    d = x.shape[-1]
    rc = rope_cache[positions][:, :, None, :]
    cos, sin = rc[..., :d].to(x.dtype), rc[..., d:].to(x.dtype)
    rotated = torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)
    return x * cos + rotated * sin


def through(module, fn, *args):
    """fn(*args) run as `module`'s forward, inside its call: the module's hooks (FSDP2 unsharding its parameters,
    a parallelism's input and output handling) run around a computation that reads its parameters directly."""
    own = module.__dict__.get("forward")
    module.forward = fn
    try:
        return module(*args)
    finally:
        if own is None:
            del module.forward
        else:
            module.forward = own


class _Kernels:
    """Fast mode: the model's own modules."""

    activation_dtype: torch.dtype | None = None
    """The dtype these kernels compute activations in (None: the model's / autocast's)."""

    def __init__(self, expert_cache: ExpertWeightCache | None = None):
        self.expert_cache = expert_cache

    def linear(self, module, x):
        return module(x)

    def norm(self, module, x):
        return module(x)

    def attention(self, q, k, v, allowed, scale):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])

    def moe(self, module, x):
        return module(x)

    def feed_forward(self, module, x):
        return module(x)

    def log_softmax(self, logits):
        return torch.log_softmax(logits.float(), dim=-1)


class _Consistent(_Kernels):
    """Consistent mode: batch-invariant kernels on the same weights, FP32 activations."""

    activation_dtype = torch.float32

    def linear(self, module, x):
        def mm(x):
            out = consistent.mm(x.reshape(-1, x.shape[-1]), module.weight)
            if module.bias is not None:
                out = out + module.bias.float()
            return out.view(*x.shape[:-1], -1)
        return through(module, mm, x)

    def norm(self, module, x):
        eps = module.eps if module.eps is not None else torch.finfo(torch.float32).eps
        return through(module, lambda x: consistent.rms_norm(x, module.weight, eps), x)

    def attention(self, q, k, v, allowed, scale):
        rep = q.shape[1] // k.shape[1]
        return consistent.attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), allowed, scale)

    def moe(self, module, x):
        return through(module, lambda x: consistent_moe(module, x.reshape(-1, x.shape[-1]).float(),
                                                        self.expert_cache).view(x.shape), x)

    def feed_forward(self, module, x):
        h = consistent.silu(self.linear(module.w1, x)) * self.linear(module.w3, x)
        return self.linear(module.w2, h)

    def log_softmax(self, logits):
        return consistent.log_softmax(logits)


def kernels(consistent_mode: bool, expert_cache: ExpertWeightCache | None = None) -> _Kernels:
    return (_Consistent if consistent_mode else _Kernels)(expert_cache)


def qkv(attn, ops: _Kernels, x: Tensor, rope_cache: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The attention's q, k, v (B, T, heads, head_dim) of x (B, T, dim): projections, q/k norms, RoPE."""
    bs, t, _ = x.shape
    q = ops.linear(attn.wq, x).view(bs, t, -1, attn.head_dim)
    k = ops.linear(attn.wk, x).view(bs, t, -1, attn.head_dim)
    v = ops.linear(attn.wv, x).view(bs, t, -1, attn.head_dim)
    if attn.q_norm is not None:
        q = ops.norm(attn.q_norm, q)
    if attn.k_norm is not None:
        k = ops.norm(attn.k_norm, k)
    return _rope(q, rope_cache, positions), _rope(k, rope_cache, positions), v


def _attention(attn, ops: _Kernels, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, positions: Tensor,
               cache_k, cache_v) -> Tensor:
    """q, k, v (B, T, heads, head_dim) -> (B, T, heads * head_dim) over the keys `allowed` (B, 1, T, slots)
    lets each query see: this call's own (no cache), or every cache slot after writing this call's keys/values
    at their positions."""
    bs, t = q.shape[:2]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if cache_k is not None:
        index = positions[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[-1])
        cache_k.scatter_(2, index, k.to(cache_k.dtype))
        cache_v.scatter_(2, index, v.to(cache_v.dtype))
        k, v = cache_k.to(q.dtype), cache_v.to(q.dtype)
    return ops.attention(q, k, v, allowed, attn.scaling).transpose(1, 2).reshape(bs, t, -1)


def _allowed(positions: Tensor, cache: "KVCache | None", documents: Tensor | None) -> Tensor:
    """(B, 1, T, slots) bool. With a cache: slots up to each query's position. Without: causal over the columns
    (positions = columns for right-padded rows), and with `documents` (B, T) ids only within a query's document
    (packed rows, positions restarting per document)."""
    if cache is not None:
        slots = torch.arange(cache.k[0].shape[2], device=positions.device)
        return slots[None, None, None, :] <= positions[:, None, :, None]
    cols = torch.arange(positions.shape[1], device=positions.device)
    allowed = (cols[None, :] <= cols[:, None])[None, None]
    if documents is not None:
        allowed = allowed & (documents[:, None, :, None] == documents[:, None, None, :])
    return allowed


def decoder_layer(layer, ops: _Kernels, h: Tensor, rope_cache: Tensor, positions: Tensor, attend) -> Tensor:
    """One Qwen3 decoder layer on h (B, T, dim); attend(q, k, v) (B, T, heads, head_dim) -> (B, T, heads *
    head_dim) is the attention core (this file's cached SDPA, or an inference engine's)."""
    attn = layer.attention
    q, k, v = qkv(attn, ops, ops.norm(layer.attention_norm, h), rope_cache, positions)
    h = h + ops.linear(attn.wo, attend(q, k, v))
    if layer.moe_enabled:
        return h + ops.moe(layer.moe, ops.norm(layer.ffn_norm, h))
    return h + ops.feed_forward(layer.feed_forward, ops.norm(layer.ffn_norm, h))


def embed(model, ops: _Kernels, tokens: Tensor) -> Tensor:
    h = model.tok_embeddings(tokens)
    return h if ops.activation_dtype is None else h.to(ops.activation_dtype)


def logits_of(model, ops: _Kernels, h: Tensor) -> Tensor:
    """The final norm and the LM head on hidden states h."""
    return ops.linear(model.output, ops.norm(model.norm, h))


@dataclass
class Batch:
    """Sequences laid out for one forward: tokens, positions (R, W), documents (R, W) ids or None (padded rows), and
    where sequence i starts: row[i], col[i]."""

    tokens: Tensor
    positions: Tensor
    documents: Tensor | None
    row: Tensor
    col: Tensor


def layout(seqs: list[list[int]], pad_id: int, packed: bool, device) -> Batch:
    """Right-padded rows, one sequence each; or packed: every sequence in one row, back to back, each with its
    own positions from 0 and attending only within itself (a per-document causal mask: no padding computed)."""
    lengths = torch.tensor([len(s) for s in seqs])
    if packed:
        starts = torch.cumsum(lengths, 0) - lengths
        tokens = torch.tensor([t for s in seqs for t in s])[None]
        positions = torch.cat([torch.arange(n) for n in lengths.tolist()])[None]
        documents = torch.repeat_interleave(torch.arange(len(seqs)), lengths)[None].to(device)
        row, col = torch.zeros(len(seqs), dtype=torch.long), starts
    else:
        width = int(lengths.max())
        tokens = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            tokens[i, :len(s)] = torch.tensor(s)
        positions = torch.arange(width).expand(len(seqs), -1)
        documents, row, col = None, torch.arange(len(seqs)), torch.zeros(len(seqs), dtype=torch.long)
    return Batch(tokens.to(device), positions.to(device), documents, row.to(device), col.to(device))


def forward(model, tokens: Tensor, positions: Tensor, ops: _Kernels, cache: KVCache | None = None,
            documents: Tensor | None = None) -> Tensor:
    """tokens, positions (B, T) -> token log-probabilities (B, T, vocab) FP32 of the next token.

    Without a cache: whole right-padded sequences (positions = column index), causal; or, with `documents` (B, T),
    packed sequences (several per row, each with its own positions), causal within each. With a cache: K/V of these
    tokens go to slots `positions`, each query attends to slots <= its position."""
    def body(tokens):
        h = embed(model, ops, tokens)
        allowed = _allowed(positions, cache, documents)
        for i, layer in enumerate(model.layers.values()):
            ck, cv = (cache.k[i], cache.v[i]) if cache is not None else (None, None)
            attend = functools.partial(_attention, layer.attention, ops, allowed=allowed, positions=positions,
                                       cache_k=ck, cache_v=cv)
            h = through(layer, functools.partial(decoder_layer, layer, ops, rope_cache=model.rope_cache,
                                                 positions=positions, attend=attend), h)
        return ops.log_softmax(logits_of(model, ops, h))
    return through(model, body, tokens)
