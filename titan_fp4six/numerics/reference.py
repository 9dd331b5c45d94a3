"""The pure-PyTorch reference quantizers: docs/numerics.md made executable.

Vectorized over blocks and rows; the only Python loop is over the 16 element positions of a block, which
pins the spec's error accumulation order. Every operation is a separate eager FP32 op (no FMA contraction)
and every division divides by an FP32 tensor (correctly rounded).
"""

import functools

import torch

from .formats import (BLOCK_SIZE, DECODE_BIG_AMAX, DECODE_RESCALE, E2M1_MAX, FLT_MAX, NAN_CODE, STANDARD_BOUND,
                      e2m1_decode, e2m1_encode, e2m1_encode_stochastic, e4m3_round, fp32_const, pack_codes,
                      unpack_codes)
from .groups import RowGroups
from .philox import stochastic_bits

# Spec step 6: the fixed tree order of the 16 row-block errors of a 16x16 tile.
_TREE_PAIRS = ((0, 8), (4, 12), (2, 10), (6, 14), (1, 9), (5, 13), (3, 11), (7, 15))


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    return fp32_const(value, like.device)


def global_encode_scale(amax: torch.Tensor, scale_bound: int) -> torch.Tensor:
    """S_enc = min((B*6)/amax, FLT_MAX), replaced by 1 where amax == 0 or S_enc == 0."""
    s_enc = torch.clamp(_f32(scale_bound * E2M1_MAX, amax) / amax, max=FLT_MAX)
    return torch.where((amax == 0) | (s_enc == 0), _f32(1.0, amax), s_enc)


def _per_row(t: torch.Tensor) -> torch.Tensor:
    """Scalar stays scalar; a per-row vector (R,) becomes (R, 1) to broadcast over (R, blocks)."""
    return t if t.dim() == 0 else t[:, None]


def _block_amax(xb: torch.Tensor, block: str) -> torch.Tensor:
    """max |x| per 1x16 block, or per 16x16 tile repeated for the tile's 16 rows. (R, C/16)."""
    absb = xb.abs()
    if block == "1x16":
        return absb.amax(dim=-1)
    rows, nblk = xb.shape[:2]
    tile = absb.view(rows // BLOCK_SIZE, BLOCK_SIZE, nblk, BLOCK_SIZE).amax(dim=(1, 3))
    return tile.repeat_interleave(BLOCK_SIZE, dim=0)


def _encode(xb: torch.Tensor, sf: torch.Tensor, s_dec: torch.Tensor, seed: int | None = None) -> torch.Tensor:
    """Unpacked E2M1 codes of each block under its E4M3 scale sf (spec step 4); with a seed rounded
    stochastically (spec section 12), element (r, c) of the (R, C) input with the 16 Philox bits of index r*C + c."""
    inv = torch.clamp(_f32(1.0, xb) / (sf.float() * s_dec), max=FLT_MAX)
    q = torch.clamp(xb * inv[..., None], -E2M1_MAX, E2M1_MAX)
    if seed is not None:
        return e2m1_encode_stochastic(q, stochastic_bits(seed, q.shape, q.device))
    # A NaN's sign bit depends on the device's arithmetic (x86 and CUDA differ), so NaN gets one canonical
    # code; its block scale is NaN (bamax or amax is NaN), so the block still decodes to NaN.
    return torch.where(torch.isnan(q), NAN_CODE, e2m1_encode(q))


def _candidate_error(xb, codes, sf, amax, scale_bound: int, err_mode: str) -> torch.Tensor:
    """Spec step 5: per 1x16 block error in the input's domain, summed over i = 0..15 in order from +0."""
    six_b = _f32(E2M1_MAX * scale_bound, xb)
    vals = ((e2m1_decode(codes) * sf.float()[..., None]) * amax[..., None]) / six_b
    diff = vals - xb
    terms = diff.abs() if err_mode == "mae" else diff * diff
    err = torch.zeros(xb.shape[:2], dtype=torch.float32, device=xb.device)
    for i in range(BLOCK_SIZE):
        err = err + terms[..., i]
    return err


def _tile_error(err: torch.Tensor) -> torch.Tensor:
    """Spec step 6: sum a 16x16 tile's 16 row-block errors in the fixed tree order; repeated per row."""
    r = err.view(err.shape[0] // BLOCK_SIZE, BLOCK_SIZE, err.shape[1]).unbind(1)
    p = [r[a] + r[b] for a, b in _TREE_PAIRS]
    total = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
    return total.repeat_interleave(BLOCK_SIZE, dim=0)


def four_over_six_candidates(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int):
    """Both candidates of a validated 2-D x: (code6, code4, sf6, sf4, err6, err4), errors per (row, block) after
    the 16x16 tile sum (repeated over the tile's rows)."""
    rows, cols = x.shape
    xb = x.float().view(rows, cols // BLOCK_SIZE, BLOCK_SIZE)
    amax_r = _per_row(amax)
    s_enc = global_encode_scale(amax_r, scale_bound)
    s_dec = _f32(1.0, x) / s_enc
    base = (_block_amax(xb, block) / _f32(E2M1_MAX, x)) * s_enc
    sf6 = e4m3_round(base)
    sf4 = e4m3_round(base * 1.5)
    code6 = _encode(xb, sf6, s_dec)
    code4 = _encode(xb, sf4, s_dec)
    err6 = _candidate_error(xb, code6, sf6, amax_r, scale_bound, err_mode)
    err4 = _candidate_error(xb, code4, sf4, amax_r, scale_bound, err_mode)
    if block == "16x16":
        err6, err4 = _tile_error(err6), _tile_error(err4)
    return code6, code4, sf6, sf4, err6, err4


def four_over_six_reference(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int,
                            choose: bool = True):
    """Four-over-six quantize of a validated 2-D x. Returns (packed codes, E4M3 scales, map-to-4 mask).

    choose=False keeps the map-to-6 candidate in every block (an operand outside the recipe's `scope`)."""
    code6, code4, sf6, sf4, err6, err4 = four_over_six_candidates(x, amax, block, err_mode, scale_bound)
    map4 = err4 < err6 if choose else torch.zeros_like(err4, dtype=torch.bool)  # strict: ties and NaN keep 6
    codes = torch.where(map4[..., None], code4, code6).view(x.shape)
    scales = torch.where(map4, sf4.view(torch.uint8), sf6.view(torch.uint8)).view(torch.float8_e4m3fn)
    return pack_codes(codes), scales, map4


def nvfp4_reference(x: torch.Tensor, amax: torch.Tensor, seed: int | None = None):
    """Standard NVFP4 (B=448, 1x16, one candidate) of a validated 2-D x. Returns (packed codes, scales).
    seed (an int in [0, 2^63)): the codes round stochastically (spec section 12) with the Philox bits of
    (seed, row-major element index); the scales are the same as without."""
    rows, cols = x.shape
    xb = x.float().view(rows, cols // BLOCK_SIZE, BLOCK_SIZE)
    amax_r = _per_row(amax)
    s_enc = global_encode_scale(amax_r, STANDARD_BOUND)
    s_dec = _f32(1.0, x) / s_enc
    mult = s_enc * (_f32(1.0, x) / _f32(E2M1_MAX, x))
    sf = e4m3_round(torch.clamp(_block_amax(xb, "1x16") * mult, max=FLT_MAX))
    return pack_codes(_encode(xb, sf, s_dec, seed).view(rows, cols)), sf


def tensor_amax_reference(x: torch.Tensor) -> torch.Tensor:
    """max |x| over the whole tensor as an FP32 scalar (NaN propagates; 0 for an empty tensor)."""
    return x.abs().amax().float() if x.numel() else torch.zeros((), dtype=torch.float32, device=x.device)


def row_amax_reference(x: torch.Tensor) -> torch.Tensor:
    """max |x| of each row of a 2-D tensor as an FP32 vector (0 for rows of no columns)."""
    if not x.shape[1]:
        return torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    return x.abs().amax(dim=-1).float()


@functools.cache
def inv_six_b(scale_bound: int) -> float:
    """fl(1/(6B)), the FP32 division's result, as a Python float (exact: an FP32 value), so multiplying an FP32
    tensor by it is the same FP32 multiply as by a tensor holding it, without a kernel to fill one."""
    return (torch.tensor(1.0) / torch.tensor(E2M1_MAX * scale_bound, dtype=torch.float32)).item()


def global_decode_factor(amax: torch.Tensor, scale_bound: int) -> torch.Tensor:
    """amax * fl(1/(6B)): the factor between block-scaled values and real values (docs/numerics.md, Decode)."""
    return amax * inv_six_b(scale_bound)


def decode_block_scaled_reference(codes: torch.Tensor, scales: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """e2m1_value * f32(block scale), without the global factor. At most 6 significant bits within bf16's
    range, so exact in bf16: the operand of the emulated GEMMs (the global factor is applied afterwards)."""
    rows, half = codes.shape
    values = e2m1_decode(unpack_codes(codes)).view(rows, half * 2 // BLOCK_SIZE, BLOCK_SIZE)
    return (values * scales.float()[..., None]).view(rows, half * 2).to(dtype)


def decode_scale(sf: torch.Tensor, amax: torch.Tensor, scale_bound: int) -> torch.Tensor:
    """(f32(sf) * amax) * fl(1/(6B)); where amax >= DECODE_BIG_AMAX (2^119) it is computed as
    ((f32(sf) * (amax * 2^-64)) * fl(1/(6B))) * 2^64: the same value wherever the first order does not overflow
    (the power-of-two factors are exact and every intermediate stays normal), finite where it would."""
    big = amax >= DECODE_BIG_AMAX
    down = torch.where(big, _f32(1 / DECODE_RESCALE, amax), _f32(1.0, amax))
    up = torch.where(big, _f32(DECODE_RESCALE, amax), _f32(1.0, amax))
    return global_decode_factor(sf * (amax * down), scale_bound) * up


def dequantize_reference(codes: torch.Tensor, scales: torch.Tensor, amax: torch.Tensor, scale_bound: int,
                         dtype) -> torch.Tensor:
    """value = e2m1_value(code) * decode_scale(f32(sf), amax), cast to dtype; amax () or (R,)."""
    rows, half = codes.shape
    scale = decode_scale(scales.float(), _per_row(amax), scale_bound)
    values = e2m1_decode(unpack_codes(codes)).view(rows, half * 2 // BLOCK_SIZE, BLOCK_SIZE)
    return (values * scale[..., None]).view(rows, half * 2).to(dtype)


def scale_cast_reference(acc: torch.Tensor, a_amax: torch.Tensor, a_bound: int, b_amax: torch.Tensor,
                         b_bound: int, dtype) -> torch.Tensor:
    """The emulated dense GEMM's epilogue (docs/numerics.md, section 8): the FP32 product acc (M, N) times
    fa * fb (that product first), cast to dtype; fa = amax_a * fl(1/(6B_a)) per tensor () or per row (M,)."""
    fa = global_decode_factor(a_amax, a_bound)
    factor = (fa[:, None] if fa.dim() else fa) * global_decode_factor(b_amax, b_bound)
    return (acc.float() * factor).to(dtype)


def expand_per_row(values: torch.Tensor, group_of_row: torch.Tensor) -> torch.Tensor:
    """Per-group values (E,) -> per row (M,) by each row's group; rows of no group (id E, past offs[-1]) get 0."""
    return torch.nn.functional.pad(values, (0, 1)).index_select(0, group_of_row)


def amax_per_row(amax: torch.Tensor, rows: int, groups: RowGroups | None = None) -> torch.Tensor:
    """Each of `rows` rows' global amax, the mapping every quantizer and dequantizer applies: amax () is the
    whole tensor's; (G,) covers runs of rows/G consecutive rows (1: per row; N: an expert's rows of flattened
    (E*N, K) weights); with `groups`, per group or per row, and 0 for the rows that are not data."""
    if groups is not None:
        values = expand_per_row(amax, groups.group_of_row) if groups.amax_by_group else amax
        return torch.where(groups.group_of_row < groups.n_groups, values, 0.0)
    if amax.dim() == 0 or amax.numel() == rows:
        return amax
    return amax[:, None].expand(-1, rows // amax.numel()).reshape(-1)


def map4_counts(map4: torch.Tensor, groups: RowGroups | None = None) -> torch.Tensor:
    """(map-to-4 blocks, blocks) of a (R, C/16) map-to-4 mask as int64 (2,), over the rows that are data."""
    if groups is None:
        return torch.stack((map4.sum(), torch.tensor(map4.numel(), device=map4.device)))
    data = groups.group_of_row < groups.n_groups
    return torch.stack(((map4 & data[:, None]).sum(), data.sum() * map4.shape[1]))


def grouped_scale_cast_reference(prod: torch.Tensor, a_amax: torch.Tensor, a_per_group: bool, w_amax: torch.Tensor,
                                 group_of_row: torch.Tensor, scale_bound: int, dtype,
                                 w_bound: int | None = None) -> torch.Tensor:
    """The emulated grouped GEMM's epilogue: prod (M, N) times fa * fw per row, fw = w_amax[expert] * fl(1/(6B)),
    fa per row (a_amax (M,)) or per group (a_amax (E,), a_per_group), cast to dtype; rows whose group_of_row is
    E or more (past offs[-1]) are +0 whatever prod holds there. B = scale_bound for both factors, or w_bound
    for fw where given (the quantized backward's dgrad: an NVFP4 gradient times four-over-six weights)."""
    valid = group_of_row < w_amax.numel()
    fa = global_decode_factor(a_amax, scale_bound)
    factor = ((expand_per_row(fa, group_of_row) if a_per_group else fa)
              * expand_per_row(global_decode_factor(w_amax, w_bound or scale_bound), group_of_row))
    return torch.where(valid[:, None], prod.float() * factor[:, None], 0).to(dtype)


def grouped_wgrad_scale_cast_reference(prod: torch.Tensor, a_amax: torch.Tensor, a_bound: int, b_amax: torch.Tensor,
                                       b_bound: int, empty_groups: torch.Tensor, dtype) -> torch.Tensor:
    """The epilogue of the grouped weight-gradient GEMM (contraction over each group's tokens): prod (E, N, K)
    times fa * fb, fa = a_amax[e] * fl(1/(6B_a)) per group (a_amax (E,)), fb = b_amax[e] * fl(1/(6B_b)) per group
    (b_amax (E,)) or b_amax[e, k] * fl(1/(6B_b)) per group and column (b_amax (E, K)), that product first, cast to
    dtype; empty groups' slices are +0."""
    fb = global_decode_factor(b_amax, b_bound)
    factor = global_decode_factor(a_amax, a_bound)[:, None, None] * (fb[:, None, :] if fb.dim() == 2 else
                                                                     fb[:, None, None])
    return torch.where(empty_groups[:, None, None], 0, prod.float() * factor).to(dtype)


def zero_rows_reference(x: torch.Tensor, flag: torch.Tensor, limit: int) -> torch.Tensor:
    """x (R, ...) in place with the rows r where flag[r] >= limit set to +0; returns x. The bf16 grouped
    backward's gradients: rows past offs[-1] (flag: the group of each row, limit E) and empty groups' weight
    gradients (flag: empty_groups, limit 1) hold whatever torch._grouped_mm leaves there."""
    return x.masked_fill_((flag.to(torch.int64) >= limit).view(-1, *(1,) * (x.dim() - 1)), 0)
