"""The package's one custom-op mechanism (CompileOpaqueOp), and the public quantizers as its ops.

torch.compile needs each op opaque (Inductor must not re-associate the quantizer arithmetic); eager code gets
nothing from the custom-op layer but its host cost (~60 us a call on an H200 host: dispatcher, schema and
alias checks). So an op runs its body directly unless torch.compile is tracing, when it is the
torch.library custom op `titan_fp4six::<name>` (its fake implementation gives Dynamo the output shapes); both
are the same function, hence the same bytes on CPU and CUDA alike. Under torch.profiler the eager call still
shows under the op's name (a range opened only while a profiler runs). The GEMM ops (titan_fp4six.ops) use the
same mechanism.
"""

import torch

from ..numerics.formats import BLOCK_SIZE, STANDARD_BOUND
from ..numerics.spec import NVFP4, four_over_six_spec
from ..numerics.validation import check_quantize_args
from .backends import backends_for
from .quantize import run_quantize


def in_profiler_range(name: str, fn, *args):
    """fn(*args), inside a torch.profiler range called `name` while a profiler records: a record_function range
    costs ~6 us even with no profiler, so unprofiled calls go straight through."""
    if not torch.autograd._profiler_enabled():
        return fn(*args)
    with torch.profiler.record_function(name):
        return fn(*args)


class CompileOpaqueOp:
    """`op(*args)`: the body in eager mode, `torch.ops.titan_fp4six.<name>` while torch.compile traces or on
    meta tensors (shape-only tracing); an op's first argument is a tensor or a non-empty list of them."""

    def __init__(self, name: str, body):
        self.qualname = f"titan_fp4six::{name}"
        self.body = body
        self.custom_op = torch.library.custom_op(self.qualname, mutates_args=())(body)
        self.register_fake = self.custom_op.register_fake

    def __call__(self, *args):
        first = args[0][0] if isinstance(args[0], list) else args[0]
        if torch.compiler.is_compiling() or first.is_meta:  # meta: the fake implementation gives the shapes
            return self.custom_op(*args)
        return in_profiler_range(self.qualname, self.body, *args)


def compile_opaque_op(name: str):
    """Decorator: `@compile_opaque_op("dense_fwd")` over the op's body (annotated like a custom op)."""
    return lambda body: CompileOpaqueOp(name, body)


def resolved_quantizer(quantizer: str, device: torch.device) -> str:
    """The public entry points' `quantizer` knob resolved for `device` (backends.backends_for); 'reference' while
    torch.compile traces (a graph traces the reference and never looks a kernel up)."""
    if torch.compiler.is_compiling():
        return "reference"
    return backends_for(quantizer, "emulated", device).quantizer


_Tensors2 = tuple[torch.Tensor, torch.Tensor]
_Tensors3 = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
_Tensors4 = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _empty_blocks(x: torch.Tensor) -> _Tensors2:
    rows, cols = x.shape
    return (x.new_empty((rows, cols // 2), dtype=torch.uint8),
            x.new_empty((rows, cols // BLOCK_SIZE), dtype=torch.float8_e4m3fn))


@compile_opaque_op("four_over_six_quantize")
def four_over_six_op(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int,
                     quantizer: str, choose: bool, check_amax: bool = False) -> _Tensors3:
    spec = four_over_six_spec(block, err_mode, scale_bound, choose)
    return run_quantize(x, amax, spec, resolved_quantizer(quantizer, x.device), False, check_amax)[:3]


@four_over_six_op.register_fake
def _(x, amax, block, err_mode, scale_bound, quantizer, choose, check_amax=False):
    check_quantize_args(x, amax, block, err_mode, scale_bound, read_values=False)
    codes, scales = _empty_blocks(x)
    return codes, scales, x.new_empty(scales.shape, dtype=torch.bool)


@compile_opaque_op("four_over_six_quantize_decode")
def four_over_six_decode_op(x: torch.Tensor, amax: torch.Tensor, block: str, err_mode: str, scale_bound: int,
                            quantizer: str, choose: bool, check_amax: bool = False) -> _Tensors4:
    spec = four_over_six_spec(block, err_mode, scale_bound, choose)
    codes, scales, map4, dec = run_quantize(x, amax, spec, resolved_quantizer(quantizer, x.device), True, check_amax)
    return dec, codes, scales, map4


@four_over_six_decode_op.register_fake
def _(x, amax, block, err_mode, scale_bound, quantizer, choose, check_amax=False):
    check_quantize_args(x, amax, block, err_mode, scale_bound, read_values=False)
    codes, scales = _empty_blocks(x)
    return x.new_empty(x.shape, dtype=torch.bfloat16), codes, scales, x.new_empty(scales.shape, dtype=torch.bool)


@compile_opaque_op("nvfp4_quantize")
def nvfp4_op(x: torch.Tensor, amax: torch.Tensor, quantizer: str, check_amax: bool = False) -> _Tensors2:
    return run_quantize(x, amax, NVFP4, resolved_quantizer(quantizer, x.device), False, check_amax)[:2]


@nvfp4_op.register_fake
def _(x, amax, quantizer, check_amax=False):
    check_quantize_args(x, amax, "1x16", "mse", STANDARD_BOUND, read_values=False)
    return _empty_blocks(x)
