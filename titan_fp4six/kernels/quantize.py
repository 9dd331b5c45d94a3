"""Triton four-over-six and standard NVFP4 quantizers, bitwise equal to numerics/reference.py: the one kernel,
its launch table and its launchers. The kernel's parts live by concern: operand_words.py (loads and stores),
encode.py (scales, codes, signs, decode: every format), four_six.py (the map-to-4 / map-to-6 choice).

Each thread owns whole 1x16 blocks: the 16 elements are a tuple of (rows, blocks) tensors unrolled at compile
time, so the error sum runs i = 0..15 in order by construction and only 16x16 tiles talk across threads (warp
shuffles, in the spec's tree order). Codes and scale values come from one-add roundings (bits.py); the
four-over-six choice from a cheap error estimate with a proven bound (the comment above four_six.value_step). A
chunk of blocks the bound cannot settle, or outside the bound's range (NaN, FP32's edges), is redone after the
chunk loop with the spec's arithmetic exactly as written. Launched with enable_fp_fusion=False (no contracted
FMA); every division is tl.math.div_rn except two the fast paths replace by exact FMA sequences (bits.div6,
encode.newton_inverse_scale). Launchers take validated arguments; titan_fp4six.quant.primitives decides when they run.
docs/kernels.md has the design and the validation, docs/results/kernels.md the H200 speed.
"""
import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..numerics.formats import MAP4_COUNT_ROWS, MAP4_COUNT_WIDTH
from ..numerics.validation import NEGATIVE_AMAX_MSG, SMALL_AMAX_MSG, check_seed
from .bits import FLT_MAX, SIGN_BIT, clamp_max, e4m3_bits, e4m3_byte, e4m3_round, f32_reciprocal, nan_max, tree_sum16
from .amax_rows import AmaxLayout, load_row_amax
from .decode import e4m3_value
from .launch import COMPILE_OPTIONS, MAX_GRID_Y, FastLaunch, cdiv
from .encode import (NEWTON_S_DEC_MAX, NEWTON_S_DEC_MIN, candidate_scales, decode_words, div, fast_encode_decode,
                     inverse_scale, newton_inverse_scale, stochastic_codes, with_signs)
from .four_six import (SLACK_DOWN, SLACK_UP, amax_in_fast_range, block_amax_again, decode_tie, error_bounds,
                       exact_candidate, fast_candidate, fast_setting, four_six_exact, tile_max, value_step)
from .operand_words import (block_magnitudes, column_start, column_words, load_column_tile, load_words, store_chunk,
                            token_block_start)


class Launch(NamedTuple):
    """How a kernel variant is launched: a chunk of rows x blocks (one block per thread), at most most_chunks
    chunks per program, warps per program and a register cap (None: the compiler's choice)."""
    rows: int
    blocks: int
    most_chunks: int
    warps: int
    max_registers: int | None = None


# Launch per (kernel, decode), the kernel a 4/6 block shape, "nvfp4" or "stochastic" (NVFP4 with stochastic codes).
# 1x16 and NVFP4: a warp covers 32 consecutive blocks of a row (1 KB of bf16 input, whole sectors of codes and
# scales), one block per thread. 16x16: a program covers 4 blocks of 16 rows (whole
# 32-byte sectors of codes). The quantizer runs it in one warp, each thread holding rows r and r + 8 of a block
# column, so every tile reduction is a register add and shuffles; capped at 96 registers (with one amax per row
# the compiler takes ~101) for 21 resident warps. The fused kernel needs more registers per block and runs it in
# two warps of 4 blocks x 8 rows, whose tile reductions cross the warps through shared memory. The fastest of the
# shapes and caps tried on an H200 (docs/results/kernels.md).
LAUNCH = {
    ("1x16", False): Launch(1, 32, 8, 1),
    ("1x16", True): Launch(1, 32, 8, 1),
    ("16x16", False): Launch(16, 4, 8, 1, max_registers=96),
    ("16x16", True): Launch(16, 4, 8, 2),
    ("nvfp4", False): Launch(1, 32, 8, 1),
    ("nvfp4", True): Launch(1, 32, 8, 1),
    ("stochastic", False): Launch(1, 32, 8, 1),
    ("stochastic", True): Launch(1, 32, 8, 1),
}
# Columnwise (x^T of a row-major x, 1x16 blocks along x's rows), per (kernel, decode) as LAUNCH: a warp covers
# 8 consecutive columns k of x and 4 consecutive blocks down each (64 rows of x), one block (16 rows of one column)
# per thread, loaded as one tile whose rows are 16-byte runs of 8 columns. Its 32 bytes of codes per column are
# whole sectors of x^T's codes, which wider shapes with fewer blocks write in 8- or 16-byte pieces: ~2x the
# 32-columns-by-one-block shape. The kernels without the decode take two such warps side by side (16 columns:
# whole 32-byte sectors of x read by one program, where 8 columns leave L2 to serve each sector twice); the
# decoding kernels, which need more registers per block, are fastest with one. The fastest shapes tried on an
# H200 (docs/results/kernels.md; `python3 -m scripts.bench kernels --only columns`).
COLUMN_LAUNCH = {
    ("1x16", False): Launch(16, 4, 8, 2),
    ("1x16", True): Launch(8, 4, 8, 1),
    ("nvfp4", False): Launch(16, 4, 8, 2),
    ("nvfp4", True): Launch(8, 4, 8, 1),
    ("stochastic", False): Launch(16, 4, 8, 2),
    ("stochastic", True): Launch(8, 4, 8, 1),
}
MIN_PROGRAMS = 4096  # about 132 SMs x 32 resident one-warp programs
_INPUT_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# The amax check's device asserts are compiled in only with debug on; sanitize_overflow off keeps the integer
# arithmetic free of the overflow asserts debug would add.
CHECK_OPTIONS = {"debug": True, "sanitize_overflow": False}
_NEGATIVE_AMAX = tl.constexpr(NEGATIVE_AMAX_MSG)
_SMALL_AMAX = tl.constexpr(SMALL_AMAX_MSG)
_COUNT_ROWS = tl.constexpr(MAP4_COUNT_ROWS)
_COUNT_WIDTH = tl.constexpr(MAP4_COUNT_WIDTH)
_COUNT_SHIFT = tl.constexpr(1 << 16)  # a program's map-to-4 count above its block count, in one int32
assert all(launch.most_chunks <= 8 and launch.rows * launch.blocks * launch.most_chunks < 1 << 15
           for launch in (*LAUNCH.values(), *COLUMN_LAUNCH.values()))


@triton.jit
def _assert_amax_covers(bamax, amax, ok):
    """The public quantizers' amax check (numerics.validation.check_amax_covers) on the blocks at `ok`: amax >= 0
    and block max <= amax, NaN on either side passing. Device asserts: a failure traps the kernel and surfaces
    at the next synchronization as "device-side assert triggered", as torch._assert_async does."""
    amax = tl.broadcast_to(amax, ok.shape)  # a tensor even from a scalar amax, as for row_fast
    tl.device_assert(~ok | ~(amax < 0.0), _NEGATIVE_AMAX)
    tl.device_assert(~ok | ~(bamax > amax), _SMALL_AMAX)


@triton.jit
def _popcount8(bits):
    """Set bits among the low 8 (a program's chunks: Launch.most_chunks <= 8)."""
    bits = (bits & 0x55) + ((bits >> 1) & 0x55)
    bits = (bits & 0x33) + ((bits >> 2) & 0x33)
    return (bits & 0x0F) + ((bits >> 4) & 0x0F)


@triton.jit
def _bit_or(a, b):
    """Combine function of a bitwise-or reduction."""
    return a | b


@triton.jit
def _global_scales(amax, six_b):
    """Spec step 1 from each row's (or block's) global amax: (S_enc, S_dec, -S_dec)."""
    s_enc = clamp_max(tl.math.div_rn(tl.zeros_like(amax) + six_b, amax), FLT_MAX)
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = div(1.0, s_enc)
    return s_enc, s_dec, (s_dec.to(tl.int32, bitcast=True) ^ SIGN_BIT).to(tl.float32, bitcast=True)


@triton.jit
def _nvfp4_multiplier(s_enc):
    """Standard NVFP4's scale input multiplier S_enc * fl(1/6)."""
    return s_enc * div(1.0, tl.full(s_enc.shape, 6.0, tl.float32))


@triton.jit
def _stochastic_settled(amax, s_dec):
    """Rows (blocks) the stochastic chunk loop settles: amax >= 0 (not NaN) and S_dec inside
    newton_inverse_scale's range (amax below ~2^-88 or above ~2^50, not 0, are outside)."""
    return (amax >= 0.0) & (s_dec >= NEWTON_S_DEC_MIN) & (s_dec <= NEWTON_S_DEC_MAX)


@triton.jit
def _token_block_scales(amax_ptr, blocks_ptr, rows, blks, R, NBLK, n_groups, amax_cols, six_b):
    """Spec step 1 per block in the token-block layout: (amax, S_enc, S_dec, -S_dec) of each block's global amax,
    its group's (amax (E,), amax_cols 0) or its group's for its row (amax (E, R), amax_cols 1); amax 0 for blocks
    of no group (group n_groups) and outside the matrix."""
    group = tl.load(blocks_ptr + 2 * NBLK + blks, mask=blks < NBLK, other=n_groups)
    index = group.to(tl.int64) * (1 + (R - 1) * amax_cols) + rows * amax_cols
    amax = tl.load(amax_ptr + index, mask=(rows < R) & (group < n_groups), other=0.0)
    s_enc, s_dec, neg_s_dec = _global_scales(amax, six_b)
    return amax, s_enc, s_dec, neg_s_dec


@triton.jit
def _block_where(rows64, blks, row_words, M, blocks_ptr, NBLK, TOKEN_BLOCKS: tl.constexpr):
    """Where the transposed kernel reads block `blks` of output row k (rows64): column_start's x^T of a row-major
    x, or with TOKEN_BLOCKS token_block_start's layout of x's token groups."""
    if TOKEN_BLOCKS:
        where = token_block_start(rows64, blks, row_words, blocks_ptr, NBLK)
    else:
        where = column_start(rows64, blks, row_words, M)
    return where


@triton.jit(do_not_specialize=["R", "NBLK", "row_words", "amax_div", "n_groups", "amax_cols", "CHUNKS", "M", "seed"])
def _quantize_kernel(x_ptr, amax_ptr, group_ptr, blocks_ptr, codes_ptr, scales_ptr, map4_ptr, dec_ptr, R, NBLK,
                     row_words, amax_div, n_groups, amax_cols, CHUNKS, M, seed, KIND: tl.constexpr,
                     FOUR_SIX: tl.constexpr,
                     TILE16: tl.constexpr, MSE: tl.constexpr, SIX_B: tl.constexpr, R6B: tl.constexpr,
                     WRITE_DEC: tl.constexpr, VEC: tl.constexpr, PTX: tl.constexpr, SCALAR_AMAX: tl.constexpr,
                     BR: tl.constexpr, NB: tl.constexpr, TRANSPOSED: tl.constexpr = False, MAP6_ONLY: tl.constexpr = False,
                     CHECK_AMAX: tl.constexpr = False, GROUPS: tl.constexpr = False, BY_GROUP: tl.constexpr = False,
                     MAP4: tl.constexpr = 1, STOCHASTIC: tl.constexpr = False, TOKEN_BLOCKS: tl.constexpr = False):
    """A program quantizes BR rows x CHUNKS chunks of NB blocks (one block per thread), so the per-row work
    (amax, global scales) and the program's launch are shared by CHUNKS blocks per thread.

    Four-over-six writes every chunk from the fast path and notes (one bit per chunk) those whose choice it
    cannot settle or that lie outside its setting; after the chunk loop those are recomputed exactly as the spec
    writes them and written again. Keeping the exact arithmetic out of the loop keeps the loop's registers (and
    so the kernel's occupancy) and its code those of the fast path alone: 0.167 against 0.175 ms for a branch
    to it inside the loop (H200, 16384x7168, 1x16, same bounds).

    The integer arguments are not specialized on their values (Triton would otherwise compile a variant per
    divisibility pattern of the shape), and each row's amax is read by load_row_amax (per tensor, per row, per
    run of rows such as an expert's, or per token group with GROUPS / BY_GROUP), so one compiled kernel serves
    every shape and the per-tensor and per-row modes; except 16x16 without row groups, whose amax is one per
    tile (per tensor, per expert, or per row and equal over each tile, as check_amax requires): a program is one
    tile row, so it reads the tile's amax as a scalar (SCALAR_AMAX) and a tile column's scales are computed once
    per thread, not once for each row it holds (0.168 -> 0.151 ms on an H200 per tensor; 1x16 gains nothing from
    it and measured 2% slower). SIX_B = 6B stays
    a constant: the divisions by it then share one reciprocal seed.

    TRANSPOSED (1x16 and NVFP4) quantizes x^T of a row-major x (M, K) in place: output row k is x's column k,
    its block b x[16b:16b+16, k] (rows from M on read as zeros), x_ptr addresses elements, row_words is x's row
    stride in elements; only the loads differ (load_column_tile and column_words build the same words), the rest
    is shared.

    TOKEN_BLOCKS (with TRANSPOSED) reads the grouped wgrad's token-block layout of x in place: block b of every
    output row is 16 rows of x from blocks_ptr[b] (its first row), of which blocks_ptr[NBLK + b] are tokens (the
    rest read as zeros), with the amax of its group blocks_ptr[2 NBLK + b] (per group, or per group and output
    row with amax_cols; _token_block_scales), so step 1 runs per block inside the chunk loop. A stochastic spec's
    random bits then follow the element's index in the (NBLK, R * 16) matrix of blocks by block index
    (docs/numerics.md section 12), the layout the reference quantizes.

    The launcher passes x, codes, map4 and the decode in their own dtypes (a host-side dtype view costs ~1 us
    each); the kernel reads x as int32 words (int16 elements when TRANSPOSED reads a 16-bit x) and writes codes
    and the decode as int32 words, scales and map4 as bytes.

    CHECK_AMAX (launched with CHECK_OPTIONS) asserts the public quantizers' amax check in the same read of x,
    instead of a second kernel that reads x again.

    MAP4 (four-over-six): 1 writes the map-to-4 flags to map4_ptr (bytes), 2 instead adds (map-to-4 blocks,
    blocks) of the rows that are data to a row of the numerics.formats.map4_count_buffer at map4_ptr (one atomic add
    each per program, the programs spread over the buffer's rows: the statistics without a mask or a reduction
    launch), 0 does neither.

    STOCHASTIC (NVFP4 only) rounds the codes stochastically with 16 random bits per element, from
    tl.randint4x(seed, element index in the quantized matrix // 8) (docs/numerics.md section 12: one Philox
    evaluation per 8 elements); seed is unused otherwise. Its scales are the nearest mode's, its inverse scales on
    a GPU newton_inverse_scale's (no division in the loop; a row whose S_dec lies outside that function's range
    is unsettled from the start, as below, and takes the division after the loop). Like four-over-six
    it keeps rare inputs out of the chunk loop: a chunk with a NaN |q| (or a row with a negative or NaN amax) is
    only noted there, and the program writes its chunks again after the loop with the NaN codes and any-input
    scale bytes; no per-chunk reduction (a shared-memory round trip and two barriers in 2-warp programs) and
    no NaN pass in the loop. Columnwise it takes block_magnitudes' byte-permute form (PERMUTE), fewer
    instructions there than the compiler's and more in the other kernels (docs/kernels.md)."""
    if TRANSPOSED and KIND != 0:
        x_ptr = x_ptr.to(tl.pointer_type(tl.int16))
    else:
        x_ptr = x_ptr.to(tl.pointer_type(tl.int32))
    codes_ptr = codes_ptr.to(tl.pointer_type(tl.int32))
    map4_ptr = map4_ptr.to(tl.pointer_type(tl.uint8))
    dec_ptr = dec_ptr.to(tl.pointer_type(tl.int32))
    six_b = SIX_B
    if TILE16:  # (blocks, rows): the tile reductions run along axis 1
        rows = (tl.program_id(0) * BR + tl.arange(0, BR))[None, :]
        lanes = tl.arange(0, NB)[:, None]
    else:  # (rows, blocks): a warp reads one long run of a row
        rows = (tl.program_id(0) * BR + tl.arange(0, BR))[:, None]
        lanes = tl.arange(0, NB)[None, :]
    rows64 = rows.to(tl.int64)

    # Step 1: global encode / decode scales, per tensor or per row; they broadcast over blocks (per block with
    # TOKEN_BLOCKS: in the chunk loop).
    if not TOKEN_BLOCKS:
        if SCALAR_AMAX:  # one 16x16 tile row per program (BR = 16), one amax per tile: the first row's
            amax = tl.load(amax_ptr + tl.program_id(0) * BR // amax_div)
            data = rows < R
        else:
            amax, data = load_row_amax(amax_ptr, group_ptr, rows, R, amax_div, n_groups, GROUPS, BY_GROUP)
        s_enc, s_dec, neg_s_dec = _global_scales(amax, six_b)
        # A tensor even from a scalar amax: Triton's interpreter cannot combine a scalar bool with a tensor.
        row_fast = amax_in_fast_range(tl.broadcast_to(amax, rows.shape))

    WORDS: tl.constexpr = 16 if KIND == 0 else 8
    PERMUTE: tl.constexpr = PTX and STOCHASTIC  # block_magnitudes' byte-permute form, columnwise
    first = tl.program_id(1) * CHUNKS * NB + lanes
    # Per thread, bit c: a block of chunk c needs the exact arithmetic. Kept per thread and or-reduced once after
    # the loop: a reduction per chunk costs a shared-memory round trip and two barriers in 2-warp programs.
    deferred = tl.zeros(rows.shape, tl.int32) + tl.zeros(lanes.shape, tl.int32)
    if not FOUR_SIX and not TOKEN_BLOCKS:  # NVFP4's scale input: bamax * (S_enc * fl(1/6))
        mult = _nvfp4_multiplier(s_enc)
    if STOCHASTIC:  # NaN once a chunk has a NaN |q|, or from the start for a row that _stochastic_settled leaves
        if TOKEN_BLOCKS:
            unsettled = tl.zeros(deferred.shape, tl.float32)
        else:
            unsettled = tl.where(_stochastic_settled(amax, s_dec), 0.0, float("nan")) + tl.zeros(deferred.shape,
                                                                                                  tl.float32)
    # 16x16 with one amax per tile row (data = rows < R) counts tiles: each tile's choice holds for its rows
    TILE_COUNT: tl.constexpr = MAP4 == 2 and TILE16 and SCALAR_AMAX
    if MAP4 == 2:  # bit c: chunk c's block (TILE_COUNT: tile) is counted and chose map-to-4 (popcounted later)
        if TILE_COUNT:  # one value per tile, in the tile errors' layout: no exchange between the tile's threads
            picked = tl.zeros(lanes.shape, tl.int32)
        else:
            picked = deferred
    if TRANSPOSED:
        tile_next = load_column_tile(x_ptr, _block_where(rows64, first, row_words, M, blocks_ptr, NBLK, TOKEN_BLOCKS),
                                     (rows < R) & (first < NBLK), KIND, VEC)
    else:
        ws_next = load_words(x_ptr, rows64 * row_words + first * WORDS, (rows < R) & (first < NBLK), WORDS, VEC)
    for chunk in tl.range(CHUNKS):
        blks = first + chunk * NB
        ok = (rows < R) & (blks < NBLK)
        if TRANSPOSED:
            word = _block_where(rows64, blks, row_words, M, blocks_ptr, NBLK, TOKEN_BLOCKS)
        else:
            word = rows64 * row_words + blks * WORDS
        if TOKEN_BLOCKS:  # step 1 per block
            amax, s_enc, s_dec, neg_s_dec = _token_block_scales(amax_ptr, blocks_ptr, rows, blks, R, NBLK, n_groups,
                                                                amax_cols, six_b)
            row_fast = amax_in_fast_range(amax)
            if not FOUR_SIX:
                mult = _nvfp4_multiplier(s_enc)
            if STOCHASTIC:
                unsettled = tl.where(_stochastic_settled(amax, s_dec), unsettled, float("nan"))
        # Read the next chunk before working on this one: its load latency hides behind this chunk's arithmetic.
        nxt = blks + NB
        if TRANSPOSED:
            tile = tile_next
            tile_next = load_column_tile(x_ptr, _block_where(rows64, nxt, row_words, M, blocks_ptr, NBLK, TOKEN_BLOCKS),
                                         (rows < R) & (nxt < NBLK) & (nxt < first + CHUNKS * NB), KIND, VEC)
            ws, xs = column_words(tile, KIND, PERMUTE)
        else:
            ws = ws_next
            ws_next = load_words(x_ptr, word + NB * WORDS, (rows < R) & (nxt < NBLK) & (nxt < first + CHUNKS * NB),
                                  WORDS, VEC)
            xs = block_magnitudes(ws, KIND)
        bamax = _block_amax(xs)
        if CHECK_AMAX:
            _assert_amax_covers(bamax, amax, ok)
        bamax = tile_max(bamax, TILE16)

        if FOUR_SIX:
            # Steps 3-7: both candidates; strict err4 < err6 picks map-to-4 (ties and NaN keep map-to-6), settled
            # by the error bounds where they separate (the comment above value_step). With the decode, the fast
            # path encodes the codes once, for the winner, together with its decode.
            base6, base4, s6, s4, inv6, inv4 = candidate_scales(bamax, s_enc, s_dec, neg_s_dec, False, PTX)
            fast = fast_setting(row_fast, bamax, inv6)  # blocks outside it are deferred
            g6 = value_step(s6, amax, R6B)
            g4 = value_step(s4, amax, R6B)
            lo6, hi6, e6 = fast_candidate(xs, inv6, g6, not WRITE_DEC, True, MSE, False)
            lo4, hi4, e4 = fast_candidate(xs, inv4, g4, not WRITE_DEC, True, MSE, False)
            low6, high6 = error_bounds(e6, g6, MSE)
            low4, high4 = error_bounds(e4, g4, MSE)
            if TILE16:
                low6, high6 = tree_sum16(low6) * SLACK_DOWN, tree_sum16(high6) * SLACK_UP
                low4, high4 = tree_sum16(low4) * SLACK_DOWN, tree_sum16(high4) * SLACK_UP
            tile_pick = high4 < low6  # 16x16: (blocks, 1), one per tile
            pick = tl.broadcast_to(tile_pick, ok.shape)
            settled = pick | (low4 >= high6) | (s4 == s6)  # the same scale gives bitwise equal errors
            if MAP6_ONLY:  # no choice to settle: map-to-6 everywhere (only the fast setting defers)
                tile_pick = tl.zeros(tile_pick.shape, tl.int1)
                pick = tl.zeros(ok.shape, tl.int1)
                settled = pick == pick
            deferred = deferred | (tl.where(fast & settled, 0, 1) << chunk)
            if TILE_COUNT:
                picked = picked | (tl.where((blks < NBLK) & tile_pick, 1, 0) << chunk)
            elif MAP4 == 2:
                picked = picked | (tl.where(ok & data & pick, 1, 0) << chunk)
            sf = e4m3_byte(tl.where(pick, s4, s6))
            dec = ()
            if WRITE_DEC:
                lo, hi, dec = fast_encode_decode(xs, ws, tl.where(pick, inv4, inv6), tl.where(pick, s4, s6), KIND)
            else:
                lo, hi = tl.where(pick, lo4, lo6), tl.where(pick, hi4, hi6)
            lo, hi = with_signs(lo, hi, ws, KIND, PTX)
            store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi, pick, dec,
                         MAP4 == 1, TILE16, WRITE_DEC)
        else:
            # Standard NVFP4: sf = e4m3(min(bamax * (S_enc * fl(1/6)), FLT_MAX)), one candidate, no error. Its
            # fast path only needs an input without NaN and a finite, non-negative amax.
            scaled = _nvfp4_scale_input(bamax, mult)
            s = e4m3_round(scaled)
            if STOCHASTIC and PTX:  # S_dec in range (else the row is unsettled): no division
                inv = newton_inverse_scale(s, s_dec, neg_s_dec)
            else:
                inv = inverse_scale(s, s_dec)
            # With the decode (WRITE_DEC): e2m1 value * the stored scale's value (NaN for a NaN scale).
            if STOCHASTIC:  # elementwise from the magnitudes, any input: no fast path to leave
                # A NaN |q| (a NaN x, a NaN inv from a NaN amax, or an infinite x times inv = 0) makes bamax * inv
                # NaN: noted per thread, the program's chunks are written again after the loop, with NaN codes and
                # scales from e4m3_bits. Elsewhere (amax >= 0, see `unsettled`) scaled is in [0, 448] and s's byte
                # is e4m3_byte's.
                unsettled = nan_max(unsettled, bamax * inv)
                sf = e4m3_byte(s)
                lo, hi, dec = _stochastic_chunk(xs, ws, sf, inv, seed, _element_index(rows64, blks, R, NBLK, TOKEN_BLOCKS),
                                                False, KIND, PTX, WRITE_DEC)
            elif tl.max(tl.where((amax >= 0.0) & (amax <= FLT_MAX) & (bamax == bamax), 0, 1)) != 0:
                lo, hi, unused = exact_candidate(x_ptr, word, ok, s, inv, amax, six_b, KIND, False, MSE, TRANSPOSED)
                sf = e4m3_bits(scaled)
                dec = ()
                if WRITE_DEC:
                    dec = decode_words(lo, hi, e4m3_value(sf))
            else:
                if WRITE_DEC:
                    lo, hi, dec = fast_encode_decode(xs, ws, inv, s, KIND, True)
                else:
                    lo, hi, unused = fast_candidate(xs, inv, s, True, False, MSE, True)
                    dec = ()
                lo, hi = with_signs(lo, hi, ws, KIND, PTX)
                sf = e4m3_byte(s)
            store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi, sf, dec,
                         False, TILE16, WRITE_DEC)

    if STOCHASTIC:
        if tl.max(tl.where(unsettled == unsettled, 0, 1)) != 0:  # rare: x or amax holds a NaN, or amax < 0
            for chunk in tl.range(CHUNKS):
                blks = first + chunk * NB
                ok = (rows < R) & (blks < NBLK)
                if TRANSPOSED:
                    ws, xs = column_words(load_column_tile(x_ptr, _block_where(rows64, blks, row_words, M, blocks_ptr,
                                                                               NBLK, TOKEN_BLOCKS), ok, KIND, VEC),
                                          KIND, PERMUTE)
                else:
                    ws = load_words(x_ptr, rows64 * row_words + blks * WORDS, ok, WORDS, VEC)
                    xs = block_magnitudes(ws, KIND)
                if TOKEN_BLOCKS:
                    _, s_enc, s_dec, neg_s_dec = _token_block_scales(amax_ptr, blocks_ptr, rows, blks, R, NBLK,
                                                                     n_groups, amax_cols, six_b)
                    mult = _nvfp4_multiplier(s_enc)
                scaled = _nvfp4_scale_input(_block_amax(xs), mult)
                sf = e4m3_bits(scaled)
                lo, hi, dec = _stochastic_chunk(xs, ws, sf, inverse_scale(e4m3_round(scaled), s_dec), seed,
                                                _element_index(rows64, blks, R, NBLK, TOKEN_BLOCKS), True, KIND, PTX,
                                                WRITE_DEC)
                store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi, sf, dec,
                             False, TILE16, WRITE_DEC)
    if FOUR_SIX:
        any_deferred = tl.reduce(deferred, None, _bit_or)
        if any_deferred != 0:  # the same threads rewrite the same blocks: no other thread touches them
            for chunk in tl.range(CHUNKS):
                if ((any_deferred >> chunk) & 1) != 0:
                    blks = first + chunk * NB
                    ok = (rows < R) & (blks < NBLK)
                    if TRANSPOSED:
                        where = _block_where(rows64, blks, row_words, M, blocks_ptr, NBLK, TOKEN_BLOCKS)
                    else:
                        where = rows64 * row_words + blks * WORDS
                    if TOKEN_BLOCKS:
                        amax, s_enc, s_dec, neg_s_dec = _token_block_scales(amax_ptr, blocks_ptr, rows, blks, R,
                                                                            NBLK, n_groups, amax_cols, six_b)
                        row_fast = amax_in_fast_range(amax)
                    bamax = block_amax_again(x_ptr, where, ok, KIND, TILE16, TRANSPOSED)
                    # a chunk whose deferred blocks are all decode ties keeps what the loop wrote (map-to-6 only
                    # defers blocks outside the fast setting: never ties)
                    if MAP6_ONLY:
                        tie = tl.zeros(ok.shape, tl.int1)
                    else:
                        tie = decode_tie(x_ptr, where, ok, bamax, s_enc, s_dec, neg_s_dec, row_fast, KIND, TILE16,
                                         TRANSPOSED, PTX)
                    if tl.max(tl.where((((deferred >> chunk) & 1) == 0) | tie, 0, 1)) != 0:
                        pick, sf, lo, hi, dec = four_six_exact(x_ptr, where, ok, bamax, amax, s_enc, s_dec, six_b,
                                                                KIND, MSE, TILE16, WRITE_DEC, TRANSPOSED, MAP6_ONLY)
                        store_chunk(codes_ptr, scales_ptr, map4_ptr, dec_ptr, rows64, blks, NBLK, ok, sf, lo, hi,
                                     pick, dec, MAP4 == 1, TILE16, WRITE_DEC)
                        if TILE_COUNT:  # the exact choice replaces the fast path's for the chunk
                            tile_pick = tl.max(tl.where(pick, 1, 0), 1, keep_dims=True) != 0
                            picked = (picked & ~(1 << chunk)) | (tl.where((blks < NBLK) & tile_pick, 1, 0) << chunk)
                        elif MAP4 == 2:
                            picked = (picked & ~(1 << chunk)) | (tl.where(ok & data & pick, 1, 0) << chunk)
        if MAP4 == 2:
            if TILE_COUNT:  # each counted tile's blocks: its rows below R
                data_rows = tl.minimum(tl.maximum(R - tl.program_id(0) * BR, 0), BR)
                in_range = tl.minimum(tl.maximum(NBLK - tl.program_id(1) * CHUNKS * NB, 0), CHUNKS * NB)
                map4_blocks = tl.sum(_popcount8(picked)) * data_rows
                blocks = in_range * data_rows
            else:  # one reduction of (map-to-4 blocks << 16) + blocks: a program counts < 2^15 blocks
                chunks_in_range = tl.minimum(tl.cdiv(tl.maximum(NBLK - first, 0), NB), CHUNKS)  # the thread's
                counts = tl.sum(_popcount8(picked) * _COUNT_SHIFT + tl.where(data, chunks_in_range, 0))
                map4_blocks, blocks = counts // _COUNT_SHIFT, counts % _COUNT_SHIFT
            slot = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) % _COUNT_ROWS
            counts_ptr = map4_ptr.to(tl.pointer_type(tl.int64)) + slot * _COUNT_WIDTH
            # relaxed: the default acq_rel fence would hold each program until its stores are visible; the counts
            # are read after the kernel, which orders them
            tl.atomic_add(counts_ptr, map4_blocks.to(tl.int64), sem="relaxed")
            tl.atomic_add(counts_ptr + 1, blocks.to(tl.int64), sem="relaxed")


@triton.jit
def _element_index(rows64, blks, R, NBLK, TOKEN_BLOCKS: tl.constexpr):
    """The flat index of each block's first element in the matrix whose index a stochastic spec's random bits
    follow: the quantized (R, NBLK * 16) matrix, or with TOKEN_BLOCKS the (NBLK, R * 16) matrix of blocks."""
    if TOKEN_BLOCKS:
        index = blks.to(tl.int64) * (R * 16) + rows64 * 16
    else:
        index = rows64 * (NBLK * 16) + blks * 16
    return index


@triton.jit
def _block_amax(xs):
    """Spec step 2: the block amax of the 16 magnitudes xs, NaN propagating."""
    bamax = xs[0]
    for i in tl.static_range(1, 16):
        bamax = nan_max(bamax, xs[i])
    return bamax


@triton.jit
def _nvfp4_scale_input(bamax, mult):
    """Standard NVFP4's scale before its E4M3 rounding: min(bamax * mult, FLT_MAX), clamped to 448."""
    return clamp_max(clamp_max(bamax * mult, FLT_MAX), 448.0)


@triton.jit
def _stochastic_chunk(xs, ws, sf, inv, seed, index, NAN: tl.constexpr, KIND: tl.constexpr, PTX: tl.constexpr,
                      WRITE_DEC: tl.constexpr):
    """Stochastic NVFP4 codes of blocks of magnitudes xs and words ws whose first element has the flat index
    `index` in the quantized matrix, with inverse scale inv: (packed codes lo and hi, the decode words by scale
    byte sf or ()). NAN: give NaN elements NAN_CODE (else some other code, see stochastic_codes)."""
    lo, hi = stochastic_codes(xs, ws, inv, seed, index, NAN, KIND, PTX)
    dec = ()
    if WRITE_DEC:
        dec = decode_words(lo, hi, e4m3_value(sf))
    return lo, hi, dec


_QUANTIZE = FastLaunch(_quantize_kernel)


@functools.cache
def _chunks_per_program(chunk_cols: int, row_groups: int, most: int) -> int:
    """Chunks each program runs: the most, up to `most`, that split a row group's chunks evenly (no program
    runs past the row's end) and still leave MIN_PROGRAMS programs to fill the GPU; 1 if none does."""
    for chunks in range(most, 1, -1):
        if chunk_cols % chunks == 0 and row_groups * (chunk_cols // chunks) >= MIN_PROGRAMS:
            return chunks
    return 1


class SpecFlags(NamedTuple):
    """The quantize kernel's compile-time flags of an operand spec (numerics.spec.OperandSpec)."""
    four_six: bool
    tile16: bool
    mse: bool
    six_b: float
    r6b: float
    map6_only: bool
    launch: str
    stochastic: bool


@functools.cache
def spec_flags(spec) -> SpecFlags:
    """The one place the kernel's constexprs come from a spec (cached per spec: fl(1/6B) costs a tensor division)."""
    four_six = spec.candidates != "nvfp4"
    stochastic = spec.rounding == "stochastic"
    six_b = 6.0 * spec.scale_bound
    return SpecFlags(four_six, spec.block == "16x16", spec.err_mode == "mse", six_b, f32_reciprocal(six_b),
                     spec.candidates == "6", spec.block if four_six else ("stochastic" if stochastic else "nvfp4"),
                     stochastic)


def _launch(x, amax, spec, decode: bool, transposed: bool = False, check_amax: bool = False, groups=None,
            map4=True, seed=None, token_blocks=None):
    """(codes, scales, map4 mask or None, decode or None) of the (rows, cols) matrix quantized by `spec`: x
    itself, or with `transposed` x^T of a row-major x (M, K) padded with zero rows to a multiple of 16 (rows = K,
    cols = ceil16(M)), read from x in place (1x16 specs only). check_amax: assert the public amax check on the
    device (not with `transposed`). amax and RowGroups `groups` as reference.amax_per_row reads them. map4
    (four-over-six): True returns the map-to-4 mask, False writes none, a formats.map4_count_buffer gets
    (map-to-4 blocks, blocks) of the data rows added (reference.map4_counts). seed: an int in [0, 2^63) for a
    spec with stochastic rounding (required there, ignored otherwise). token_blocks (with `transposed`): the
    (3, P/16) int32 table of the token-block layout (quantize_token_blocks), amax per group (E,) or per group and
    column (E, K); cols = P."""
    flags = spec_flags(spec)
    if flags.stochastic:
        check_seed(seed)
    if token_blocks is not None:
        cols, rows = token_blocks.shape[1] * 16, x.shape[1]
        row_words = x.stride(0)
        launch = COLUMN_LAUNCH[flags.launch, decode]
    elif transposed:
        cols, rows = -(-x.shape[0] // 16) * 16, x.shape[1]
        row_words = x.stride(0)  # the kernel loads elements
        launch = COLUMN_LAUNCH[flags.launch, decode]
    else:
        rows, cols = x.shape
        row_words = x.stride(0) * x.element_size() // 4
        launch = _row_launch(LAUNCH[flags.launch, decode], cols // 16)
    nblk = cols // 16
    codes = torch.empty(rows, cols // 2, dtype=torch.uint8, device=x.device)
    scales = torch.empty(rows, nblk, dtype=torch.uint8, device=x.device)
    if not flags.four_six or map4 is False:
        map4_mode, map4_out, mask = 0, scales, None
    elif map4 is True:
        mask = torch.empty(rows, nblk, dtype=torch.bool, device=x.device)
        map4_mode, map4_out = 1, mask
    else:
        map4_mode, map4_out, mask = 2, map4, None
    dec = torch.empty(rows, cols, dtype=torch.bfloat16, device=x.device) if decode else None
    row_groups, chunk_cols = cdiv(rows, launch.rows), cdiv(nblk, launch.blocks)
    chunks = _chunks_per_program(chunk_cols, row_groups, launch.most_chunks)
    if chunk_cols // chunks > MAX_GRID_Y:
        raise ValueError(f"x of shape {tuple(x.shape)} needs {chunk_cols // chunks} programs along its blocks; the "
                         f"kernel's grid takes at most {MAX_GRID_Y}: split x")
    if rows and nblk:
        if token_blocks is None:
            layout = AmaxLayout.of(amax, rows, groups)
            blocks, n_groups, amax_cols = scales, layout.n_groups, 0  # blocks_ptr unused: any tensor
        else:
            layout = AmaxLayout(scales, 1, 0, False, False)
            blocks, n_groups, amax_cols = token_blocks, amax.shape[0], int(amax.dim() == 2)
        _QUANTIZE((row_groups, chunk_cols // chunks), _QUANTIZE.Args(
            x_ptr=x, amax_ptr=amax, group_ptr=layout.group_ptr, blocks_ptr=blocks, codes_ptr=codes, scales_ptr=scales,
            map4_ptr=map4_out, dec_ptr=scales if dec is None else dec, R=rows, NBLK=nblk, row_words=row_words,
            amax_div=layout.amax_div, n_groups=n_groups, amax_cols=amax_cols, CHUNKS=chunks, M=x.shape[0],
            seed=seed if flags.stochastic else 0, KIND=_INPUT_KIND[x.dtype], FOUR_SIX=flags.four_six,
            TILE16=flags.tile16, MSE=flags.mse, SIX_B=flags.six_b, R6B=flags.r6b, WRITE_DEC=decode,
            VEC=_vector_loads(x, transposed, row_words, launch), PTX=x.is_cuda,
            SCALAR_AMAX=flags.four_six and flags.tile16 and not layout.groups and token_blocks is None,
            BR=launch.rows, NB=launch.blocks,
            TRANSPOSED=transposed, MAP6_ONLY=flags.map6_only, CHECK_AMAX=check_amax, GROUPS=layout.groups,
            BY_GROUP=layout.by_group, MAP4=map4_mode, STOCHASTIC=flags.stochastic,
            TOKEN_BLOCKS=token_blocks is not None),
            num_warps=launch.warps, maxnreg=launch.max_registers, **COMPILE_OPTIONS,
            **(CHECK_OPTIONS if check_amax else {}))
    return codes, scales.view(torch.float8_e4m3fn), mask, dec


def _row_launch(launch: Launch, nblk: int) -> Launch:
    """A one-row launch (1x16, NVFP4: a warp on NB consecutive blocks of a row) for short rows of nblk blocks
    (fewer than most_chunks whole chunks, where a part-empty chunk is a large share), with NB halved while NB
    does not divide nblk (down to 8), the warp then taking 32 / NB rows: no chunk runs part empty and a
    program's fixed work serves more blocks (768 columns: 48 blocks as 3 chunks of 16 in 2 rows, not a chunk
    of 32 and a half-empty one in 1). Other rows, and blocks no such NB divides, keep the launch."""
    if launch.rows != 1 or nblk >= launch.blocks * launch.most_chunks:
        return launch
    blocks = launch.blocks
    while nblk % blocks and blocks > 8:
        blocks //= 2
    if blocks == launch.blocks or nblk % blocks:
        return launch
    return launch._replace(rows=launch.blocks // blocks, blocks=blocks)


def _vector_loads(x, transposed: bool, row_words: int, launch: Launch) -> bool:
    """Whether the kernel may read x 16 bytes per access: x 16-byte aligned, and its rows 16-byte aligned
    (row-major) or, read columnwise, its row stride, its column count and the launch's columns per program
    multiples of 16 bytes' worth of elements (so every run of that many columns a thread reads is aligned and
    wholly inside or outside x)."""
    if x.data_ptr() % 16:
        return False
    if not transposed:
        return row_words % 4 == 0
    per_access = 16 // x.element_size()
    return x.stride(0) % per_access == 0 and x.shape[1] % per_access == 0 and launch.rows % per_access == 0


def eligible(x: torch.Tensor) -> bool:
    """Inputs the kernels take (shape and dtype already validated): CUDA, rows contiguous and 4-byte aligned."""
    return (x.is_cuda and x.stride(1) == 1 and (x.stride(0) * x.element_size()) % 4 == 0
            and x.data_ptr() % 4 == 0)


def quantize(x, amax, spec, decode: bool = False, check_amax: bool = False, groups=None, map4=True, seed=None):
    """(codes, scales, map4 mask or None, bf16 block-scaled decode or None) of a validated x quantized by `spec`
    in one read of x; bitwise equal to the reference of the amax per row (reference.amax_per_row of amax and
    RowGroups `groups`). check_amax: the public amax check as device asserts, in the same read of x; map4 as
    _launch takes it; seed for a stochastic spec."""
    return _launch(x, amax, spec, decode, check_amax=check_amax, groups=groups, map4=map4, seed=seed)


def eligible_columnwise(x: torch.Tensor) -> bool:
    """Inputs the columnwise kernels take: CUDA, unit column stride (any row stride)."""
    return x.is_cuda and x.stride(1) == 1


def quantize_columnwise(x, amax, spec, decode: bool = False, map4=True, seed=None):
    """x^T of a row-major x (M, K) quantized by a 1x16 `spec` with a per-tensor amax, read in place: x^T padded
    with zero columns to ceil16(M), i.e. the quantization of the zero-padded x^T made contiguous, without
    materializing it. Arguments checked by the caller (the quant layer): amax FP32 of shape () on x's device,
    x eligible_columnwise. Returns (codes uint8 (K, ceil16(M) / 2), scales float8_e4m3fn (K, ceil16(M) / 16),
    map4 mask or None, bf16 decode (K, ceil16(M)) or None)."""
    return _launch(x, amax, spec, decode, transposed=True, map4=map4, seed=seed)


def quantize_token_blocks(x, blocks, amax, spec, decode: bool = False, seed=None):
    """The grouped wgrad's columnwise operand of x (M, K) read in place by token blocks (1x16 `spec`): blocks a
    numerics.groups.TokenBlocks (its (3, P/16) int32 table: first row of x, tokens, group of each 16-token block),
    amax per group (E,) or per group and column (E, K) (FP32; blocks of no group take 0). Returns (codes uint8
    (K, P/2), scales float8_e4m3fn (K, P/16), None, bf16 decode (K, P) or None), bitwise the reference's
    (quant.quantize.run_quantize_token_blocks)."""
    return _launch(x, amax, spec, decode, transposed=True, map4=False, seed=seed, token_blocks=blocks.table)
