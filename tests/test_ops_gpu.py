"""The ops on CUDA: the same quantization as on CPU, the emulated GEMMs within accumulation-order rounding of
the CPU results, and the CUDA grouped GEMM's tail rows and empty groups handled."""

import pytest
import torch

from titan_fp4six import FourOverSixRecipe, four_over_six_grouped_mm, four_over_six_linear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _dense_run(device, recipe, x, w, dy):
    x = x.to(device, copy=True).requires_grad_()
    w = w.to(device, copy=True).requires_grad_()
    out = four_over_six_linear(x, w, recipe=recipe)
    out.backward(dy.to(device))
    return [t.detach().cpu() for t in (out, x.grad, w.grad)]


@pytest.mark.parametrize("recipe", [FourOverSixRecipe(), FourOverSixRecipe(weight_block="1x16"),
                                    FourOverSixRecipe(activation_scaling="row", backward="dequantized"),
                                    FourOverSixRecipe(backward="high_precision")])
def test_dense_cuda_matches_cpu(recipe):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 75, 256, generator=g).bfloat16()
    w = (torch.randn(128, 256, generator=g) * 0.05).bfloat16()
    dy = torch.randn(4, 75, 128, generator=g).bfloat16()
    fwd = torch.ops.titan_fp4six.dense_fwd
    key = recipe.resolve(grouped=False).key
    cpu_q, gpu_q = fwd(x.view(-1, 256), w, key), fwd(x.view(-1, 256).cuda(), w.cuda(), key)
    for c, d in zip(cpu_q[1:], gpu_q[1:]):  # codes, scales, amax: bitwise
        assert torch.equal(c.view(torch.uint8) if c.dtype == torch.float8_e4m3fn else c,
                           d.cpu().view(torch.uint8) if d.dtype == torch.float8_e4m3fn else d.cpu())
    for c, d in zip(_dense_run("cpu", recipe, x, w, dy), _dense_run("cuda", recipe, x, w, dy)):
        torch.testing.assert_close(d, c, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("mode", ["high_precision", "dequantized"])
def test_grouped_cuda_tail_rows_and_empty_groups(mode):
    g = torch.Generator().manual_seed(1)
    A = torch.randn(400, 256, generator=g).bfloat16()
    W = (torch.randn(8, 128, 256, generator=g) * 0.05).bfloat16()
    dy = torch.randn(400, 128, generator=g).bfloat16()
    offs = torch.tensor([0, 50, 50, 170, 300, 300, 333, 352], dtype=torch.int32)
    recipe = FourOverSixRecipe(backward=mode)
    results = []
    for device in ("cpu", "cuda"):
        a, w = A.to(device, copy=True), W.to(device, copy=True)
        if device == "cuda":  # garbage in the non-token rows, and recycled memory for the kernels' outputs
            a[352:] = float("nan")
            torch.empty(1 << 26, device=device).fill_(float("nan"))
        a, w = a.requires_grad_(), w.requires_grad_()
        out = four_over_six_grouped_mm(a, w.transpose(-2, -1), offs.to(device), recipe=recipe)
        out.backward(dy.to(device))
        results.append([t.detach().cpu() for t in (out, a.grad, w.grad)])
    (out_c, da_c, dw_c), (out_g, da_g, dw_g) = results
    assert not out_g[352:].any() and not da_g[352:].any()
    assert not dw_g[0].any() and not dw_g[2].any() and not dw_g[5].any()
    for c, d in zip(results[0], results[1]):
        torch.testing.assert_close(d, c, rtol=2 ** -7, atol=2e-3)
