"""The rht16 Triton kernel (and the transformed columnwise quantization built on it) against the reference, bitwise,
under Triton's interpreter on the CPU: `TRITON_INTERPRET=1 python -m tests.helpers.interp_rht` (tests/test_rht.py
runs it in a subprocess). Prints `configs N` when every case matches; exits 1 at the first mismatch."""

import sys

import torch

from tests.helpers.rht_cases import edge_matrix, same_bits
from titan_fp4six.kernels import hadamard as kh
from titan_fp4six.kernels import quantize as kq
from titan_fp4six.numerics.hadamard import rht16_columns_reference
from titan_fp4six.numerics.groups import TokenBlocks
from titan_fp4six.numerics.reference import four_over_six_reference, nvfp4_reference, tensor_amax_reference
from titan_fp4six.numerics.spec import OperandSpec
from titan_fp4six.quant.amax import token_groups_amax_reference

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _transform_cases():
    g = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for m, k in ((1, 16), (15, 48), (16, 16), (17, 160), (40, 272)):
            yield f"randn {dtype} {m}x{k}", torch.randn(m, k, generator=g).to(dtype)
        wide = torch.randn(48, 144, generator=g) * torch.exp(4 * torch.randn(48, 144, generator=g))
        yield f"wide {dtype}", wide.clamp(-6e4, 6e4).to(dtype)
        yield f"edge {dtype}", edge_matrix(dtype, g)
        base = torch.randn(33, 200, generator=g).to(dtype)
        yield f"row stride {dtype}", base[:, 8:136]  # row stride 200, unit column stride, offset start


def main() -> int:
    configs = 0
    for name, x in _transform_cases():
        got, want = kh.rht16_columns(x), rht16_columns_reference(x)
        fused, amax = kh.rht16_columns_amax(x)  # the same pass taking max |output| and max |input|
        want_amax = torch.stack((tensor_amax_reference(want), tensor_amax_reference(x)))
        if not (same_bits(got, want) and same_bits(fused, want) and same_bits(amax, want_amax)):
            print(f"MISMATCH transform {name}")
            return 1
        configs += 1
    # the grouped wgrad's token-block layout read in place (empty groups, a group under 16 tokens, rows past
    # offs[-1] holding NaN that no block reads, a NaN token, the largest values), against the transform of the
    # gathered layout; the per-group amaxes against the transformed layout's and x's token groups'
    g = torch.Generator().manual_seed(2)
    for dtype in DTYPES:
        for ends in ([0, 12, 12, 30, 47], [50], [3, 20, 20, 50]):
            x = (torch.randn(50, 48, generator=g) * torch.exp(3 * torch.randn(50, 48, generator=g))).to(dtype)
            x[ends[-1]:] = float("nan")
            if len(ends) == 4:
                x[7, 5], x[25, 40] = float("nan"), torch.finfo(dtype).max
            offs = torch.tensor(ends, dtype=torch.int32)
            blocks = TokenBlocks.of(offs, x.shape[0])
            got, amax = kh.rht16_token_blocks_amax(x, blocks)
            want = rht16_columns_reference(blocks.gather(x))
            want_amax = torch.stack((token_groups_amax_reference(want, blocks.ends),
                                     token_groups_amax_reference(x, offs)))
            if not (same_bits(got, want) and same_bits(amax, want_amax)):
                print(f"MISMATCH token blocks {dtype} {ends}")
                return 1
            configs += 1
    # the transformed columnwise operand: kernel transform -> amax -> columnwise quantizer, against the reference
    g = torch.Generator().manual_seed(1)
    for spec in (OperandSpec(transform="rht16"), OperandSpec("6", transform="rht16"),
                 OperandSpec(err_mode="mae", scale_bound=448, transform="rht16"),
                 OperandSpec(candidates="nvfp4", scale_bound=448, transform="rht16")):
        for x in (torch.randn(37, 48, generator=g).bfloat16(), edge_matrix(torch.bfloat16, g)[:, :32]):
            t = kh.rht16_columns(x)
            amax = tensor_amax_reference(t)
            codes, scales, _, dec = kq.quantize_columnwise(t, amax, spec.untransformed, True, map4=False)
            t_ref = rht16_columns_reference(x)
            xt = t_ref.t().contiguous()
            if spec.candidates == "nvfp4":
                rc, rs = nvfp4_reference(xt, tensor_amax_reference(t_ref))
            else:
                rc, rs, _ = four_over_six_reference(xt, tensor_amax_reference(t_ref), spec.block, spec.err_mode,
                                                    spec.scale_bound, spec.choose)
            if not (torch.equal(codes, rc) and torch.equal(scales.view(torch.uint8), rs.view(torch.uint8))):
                print(f"MISMATCH quantize {spec} {tuple(x.shape)}")
                return 1
            configs += 1
    print(f"configs {configs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
