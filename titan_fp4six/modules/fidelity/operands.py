"""One GEMM's operands (GemmCase) and each operand's quantization error as the op quantizes it.

The quantized backward's operands come from the op's own builder (quant.grad_operands), dequantized here next to
the tensor each quantizer reads; the forward's from the public quantizers with the plan's specs and amaxes.
"""

from dataclasses import dataclass, replace

import torch

from ...numerics.formats import BLOCK_SIZE
from ...numerics.groups import RowGroups, TokenBlocks
from ...numerics.reference import amax_per_row, global_decode_factor
from ...numerics.spec import OperandSpec
from ...ops import FourOverSixRecipe
from ...quant import four_over_six_quantize, group_amax, nvfp4_dequantize, nvfp4_quantize, row_amax, tensor_amax
from ...quant.amax import run_expert_amax, run_token_groups
from ...quant.grad_operands import dense_grad_operands, grouped_grad_operands
from ...quant.operands import GemmQuantizers, Operand, gemm_quantizers
from ...quant.process_state import MAP4_STATS
from ...quant.quantize import padded_transpose, run_rht16_columns
from ...quant.recipe import GemmPlan
from .metrics import relative_mse


@dataclass
class GemmCase:
    """One GEMM's operands: x (M, K) and dy (M, N) in the operands' dtype; w (N, K), or (E, N, K) experts with
    offs the int32 inclusive group ends (offs[-1] == M). token_rows: the rows of x that are tokens where the others
    are zero padding (they change no metric but would dilute the map-to-4 fraction); None: all."""

    name: str
    x: torch.Tensor
    w: torch.Tensor
    dy: torch.Tensor
    recipe: FourOverSixRecipe
    offs: torch.Tensor | None = None
    token_rows: torch.Tensor | None = None

    def __post_init__(self):
        rows, n = self.x.shape[0], self.w.shape[-2]
        if self.dy.shape != (rows, n):
            raise ValueError(f"{self.name}: dy has shape {tuple(self.dy.shape)}; x {tuple(self.x.shape)} and w "
                             f"{tuple(self.w.shape)} need (M, N) = ({rows}, {n})")
        if self.offs is not None and int(self.offs[-1]) != rows:
            raise ValueError(f"{self.name}: offs[-1]={int(self.offs[-1])} but x has {rows} rows; pass the token rows")

def _spec_error(t, amax, spec: OperandSpec, quantizer: str):
    """(relative MSE, map-to-4 mask) of t quantized by the forward operand `spec`, as the op quantizes it."""
    if spec.candidates == "nvfp4":
        q = nvfp4_quantize(t, amax, quantizer=quantizer, validate_amax=False)
    else:
        q = four_over_six_quantize(t, amax, block=spec.block, err_mode=spec.err_mode, scale_bound=spec.scale_bound,
                                   quantizer=quantizer, choose=spec.choose, validate_amax=False)
    return relative_mse(t, nvfp4_dequantize(q.codes, q.scales, amax, scale_bound=spec.scale_bound)), q.map4

def _activation_amax(case: GemmCase, plan: GemmPlan) -> torch.Tensor:
    """x's amax as the op takes it: per row (row-scaled), per token group (experts) or per tensor."""
    x = case.x
    if plan.row_scaled:
        return row_amax(x)
    if case.offs is None:
        return tensor_amax(x)
    sizes = torch.diff(case.offs, prepend=case.offs.new_zeros(1))
    return group_amax(x, case.offs).repeat_interleave(sizes, output_size=x.shape[0])

def _dequantized(op: Operand, factor: torch.Tensor, quantizer: str) -> torch.Tensor:
    """op's block-scaled decode in FP32 (R, C) times the global decode factor of each row (R,) or element (R, C)."""
    decoded = op.block_scaled(quantizer).float()
    decoded = decoded.reshape(-1, decoded.shape[-1])  # an (E, K, N) view of transposed expert tiles -> rows
    return decoded * (factor[:, None] if factor.dim() == 1 else factor)

def _row_factors(amax: torch.Tensor, rows: int, bound: int, groups: RowGroups | None = None) -> torch.Tensor:
    return global_decode_factor(amax_per_row(amax, rows, groups).float().expand(rows), bound)

def _columnwise_pair(t: torch.Tensor, op: Operand, amax: torch.Tensor, spec: OperandSpec,
                     quantizer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(t^T as the columnwise quantizer reads it: transformed by spec.transform, zero-padded to ceil16(M) tokens;
    its dequantized operand), amax () or one per row of t^T."""
    ref = padded_transpose(run_rht16_columns(t, quantizer) if spec.transform != "none" else t)
    return ref, _dequantized(op, _row_factors(amax, ref.shape[0], spec.scale_bound), quantizer)

def _token_blocks_pair(t: torch.Tensor, tb: TokenBlocks, op: Operand, amax: torch.Tensor, spec: OperandSpec,
                       quantizer: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(t^T in the grouped wgrad's token-block layout (C, P), transformed by spec.transform; its dequantized
    operand), amax per group (E,) or per group and column (E, C)."""
    laid = tb.gather(t)
    if spec.transform != "none":
        laid = run_rht16_columns(laid, quantizer)
    factor = global_decode_factor(tb.block_amax(amax), spec.scale_bound).repeat_interleave(BLOCK_SIZE, dim=0)
    factor = factor[None, :] if factor.dim() == 1 else factor.t()
    return laid.t(), _dequantized(op, factor.expand(laid.shape[1], -1), quantizer)

@torch.no_grad()
def quantized_backward_operands(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, recipe: FourOverSixRecipe,
                                offs: torch.Tensor | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{role: (operand, its dequantization)} for roles dy, dyT, xT, wT of the GEMM x (M, K) times w^T with output
    gradient dy (M, N), under `recipe` with backward='quantized': dense (w (N, K), offs None) or grouped (w (E, N,
    K) experts, offs the int32 inclusive token-group ends). The operands are the op's own
    (quant.grad_operands, seeds from GRADIENT_ROUNDING in the op's order), each next to the tensor its quantizer
    reads: dy (grouped: rows past offs[-1] zero, N zero-padded to a multiple of 16 for 1x16 weights); dyT and xT
    transposed and blocked along the tokens (dense: zero-padded to ceil16(M); grouped: each group padded to
    16-token blocks), Hadamard-transformed with wgrad_rht; wT = W^T (16x16: the forward's tiles transposed)."""
    grouped = offs is not None
    p = replace(recipe, backward="quantized").plan(grouped=grouped)  # wgrad_rht, gradient_rounding kept
    gq = gemm_quantizers(p.key, grouped, dy.device)
    with MAP4_STATS.paused():  # the forward's tiles, quantized again here, are no training forward
        if not grouped:
            return _dense_backward_operands(dy, x, w, gq)
        return _grouped_backward_operands(dy, x, w, offs, gq)


def _dense_backward_operands(dy, x, w, gq: GemmQuantizers) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    p, q = gq.plan, gq.backends.quantizer
    w_amax = tensor_amax(w)
    tiles = gq.w.rows(w, w_amax) if p.w_t.block == "16x16" else None  # the forward's tiles
    x_amax = tensor_amax(x)  # the forward's; a row-scaled x^T takes its column amaxes in the builder
    g = dense_grad_operands(dy, x, w, tiles, x_amax, w_amax, gq, True, True)
    return {"dy": (dy, _dequantized(g.dy, _row_factors(g.dy_amax, dy.shape[0], p.dy.scale_bound), q)),
            "dyT": _columnwise_pair(dy, g.dy_t, g.dy_t_amax, p.dy_t, q),
            "xT": _columnwise_pair(x, g.x_t, g.x_t_amax, p.x_t, q),
            "wT": (_columnwise_pair(w, g.w_t, w_amax, p.w_t, q) if p.w_t.block == "1x16" else
                   (w.t(), _dequantized(g.w_t, _row_factors(w_amax, w.shape[1], p.w_t.scale_bound), q)))}

def _grouped_backward_operands(dy, x, w, offs, gq: GemmQuantizers) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    p, q = gq.plan, gq.backends.quantizer
    experts, n, k = w.shape
    w_rows = w.reshape(experts * n, k)
    w_amax = run_expert_amax(w_rows, experts, q)
    tiles = gq.w.rows(w_rows, w_amax) if p.w_t.block == "16x16" else None
    a_amax, group_of_row, _ = run_token_groups(x, offs, p.row_scaled, q)
    g = grouped_grad_operands(dy, x, w.transpose(-2, -1), offs, group_of_row, a_amax, tiles, w_amax, gq, True, True)
    pad_n = -n % BLOCK_SIZE  # 1x16 weights: N zero-padded as the op pads it (16x16 tiles need N % 16 == 0)
    dy_rows = torch.nn.functional.pad(dy, (0, pad_n))
    groups = RowGroups(group_of_row, experts, amax_by_group=True)
    w_t = torch.nn.functional.pad(w.transpose(1, 2).reshape(experts * k, n), (0, pad_n))
    return {"dy": (torch.where((group_of_row < experts)[:, None], dy_rows, 0),
                   _dequantized(g.dy, _row_factors(g.dy_amax, dy.shape[0], p.dy.scale_bound, groups), q)),
            "dyT": _token_blocks_pair(dy, g.tokens, g.dy_t, g.dy_t_amax, p.dy_t, q),
            "xT": _token_blocks_pair(x, g.tokens, g.x_t, g.x_t_amax, p.x_t, q),
            "wT": (w_t, _dequantized(g.w_t, _row_factors(w_amax, experts * k, p.w_t.scale_bound), q))}

def _weight_rows(case: GemmCase) -> tuple[torch.Tensor, torch.Tensor]:
    """(w as quantized rows, its amax): (N, K) per tensor, or experts flattened to (E*N, K), one amax each."""
    if case.offs is None:
        return case.w, tensor_amax(case.w)
    experts, n, k = case.w.shape
    rows = case.w.reshape(experts * n, k)
    ends = torch.arange(1, experts + 1, device=rows.device, dtype=torch.int32) * n
    return rows, group_amax(rows, ends).repeat_interleave(n)

def operand_errors(case: GemmCase, recipe: FourOverSixRecipe) -> dict[str, float]:
    """Relative quantization MSE per operand role and the forward's map-to-4 fraction under `recipe`."""
    plan = recipe.plan(grouped=case.offs is not None)
    x_amax, (w, w_amax) = _activation_amax(case, plan), _weight_rows(case)
    mse_x, map4_x = _spec_error(case.x, x_amax, plan.x, recipe.quantizer)
    map4_x = map4_x if case.token_rows is None else map4_x[case.token_rows]
    mse_w, map4_w = _spec_error(w, w_amax, plan.w, recipe.quantizer)
    out = {"map4_fraction": (map4_x.sum() + map4_w.sum()).item() / (map4_x.numel() + map4_w.numel()),
           "mse_x": mse_x, "mse_w": mse_w}
    # the quantized backward's operands, whichever backward the recipe runs, as the op quantizes them
    for role, (t, deq) in quantized_backward_operands(case.dy, case.x, case.w, recipe, case.offs).items():
        out[f"mse_{role}"] = relative_mse(t, deq)
    return out
