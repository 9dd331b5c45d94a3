"""Launch a Triton kernel through its compiled launcher, skipping Triton's per-call argument binding.

`kernel[grid](...)` binds and specializes every argument in Python on each call: 30-70 us of host time per
launch on the H200 machine's host, against ~13 us for the compiled launcher alone (measured). The ops launch
several kernels per GEMM, so on the small GEMMs of debug models that host time, not the GPU, set the step time.

FastLaunch goes through `kernel[grid](...)` the first time it meets a specialization (Triton compiles, caches
and launches as usual) and keeps the compiled kernel Triton returns; later calls with the same specialization
call that kernel's launcher with the same arguments, as Triton's own launch path does. The specialization key
is at least as fine as Triton's: constexpr values, each tensor's dtype and 16-byte alignment, each integer's
width (and, unless the kernel says do_not_specialize, whether it is 1 or a multiple of 16), the launch options
and the device. Under the Triton interpreter, while launch hooks are installed (profilers such as proton), or
on a Triton release whose compiled-launcher interface the GPU suite has not run on (DIRECT_TRITON), every call
takes Triton's own path: the same kernels and bytes, only the host time differs.

Arguments travel by name: `launcher.Args(x_ptr=..., ...)` is a named tuple of every kernel parameter in signature
order (constexprs and defaulted ones included), so a misspelt, missing or extra argument is a TypeError where it
is built and two arguments cannot trade places by position; the launcher takes nothing else.
"""

import collections
import inspect

import torch
import triton

DIRECT_TRITON = ("3.6.",)
"""Triton releases whose compiled launcher (CompiledKernel.run, packed_metadata) the GPU suite ran the direct
path on; pyproject pins triton to the releases the suites ran on at all."""
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension
COMPILE_OPTIONS = {"enable_fp_fusion": False}  # the spec rounds each operation: no contraction of a*b + c into an FMA

try:
    from triton import knobs as _knobs
except ImportError:  # older Triton: no hooks object to consult; never take the direct path
    _knobs = None


def check_grid_y(grid: tuple[int, ...], what: str) -> None:
    """Raise where a launch over `what` (e.g. "a product of shape (M, N)") needs more programs along its grid's
    second dimension than CUDA allows."""
    if grid[1] > MAX_GRID_Y:
        raise ValueError(f"{what} needs {grid[1]} programs along a row; the grid takes at most {MAX_GRID_Y}")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host integers for grids: triton.cdiv is a constexpr function whose wrapper costs ~2 us
    a call on the host (22 calls per dense GEMM's forward and backward)."""
    return -(-a // b)


def _hooks_installed() -> bool:
    """Whether launch hooks are installed (None or an empty HookChain, by Triton version, means none)."""
    if _knobs is None:
        return True
    runtime = _knobs.runtime
    return _active(runtime.launch_enter_hook) or _active(runtime.launch_exit_hook)


def _active(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


def _runtime_key(arg):
    """What Triton specializes on for an argument the generated key does not handle inline: a tensor (also a
    subclass such as nn.Parameter) by dtype and 16-byte alignment, anything else that is not an int by type."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    return type(arg)


def _key_function(kinds):
    """A function (device, options, *args) -> the specialization key, generated for one kernel's parameter kinds
    (as Triton generates its own binder): one expression per parameter and no loop, type dispatch or list
    building per call, which made the key 8 us of a 28 us launch on the H200 host. Per parameter: a constexpr's
    value; a tensor's dtype and alignment; an int's 32-bit width and, unless do_not_specialize, whether it is 1
    or a multiple of 16; any other value's type."""
    terms = []
    for i, kind in enumerate(kinds):
        a = f"a{i}"
        if kind == "constexpr":
            terms.append(a)
            continue
        ints = f"-2147483648 <= {a} < 2147483648"
        if kind == "int_specialized":
            ints = f"({ints}, {a} == 1, {a} % 16 == 0)"
        terms.append(f"(({a}.dtype, {a}.data_ptr() % 16 == 0) if type({a}) is _Tensor else "
                     f"({ints}) if type({a}) is int else _runtime_key({a}))")
    params = "".join(f", a{i}" for i in range(len(kinds)))
    source = f"def key(device, options{params}):\n    return (device, options, {', '.join(terms)})\n"
    namespace = {"_Tensor": torch.Tensor, "_runtime_key": _runtime_key}
    exec(compile(source, "<FastLaunch key>", "exec"), namespace)
    return namespace["key"]


class FastLaunch:
    """`launcher = FastLaunch(jit_fn)`; `launcher(grid, launcher.Args(name=value, ...), **options)` ==
    `jit_fn[grid](name=value, ..., **options)`, every parameter named (constexprs included)."""

    def __init__(self, fn):
        self.fn = fn
        names = tuple(inspect.signature(fn.fn).parameters)  # fn.fn: the Python function, compiled or interpreted
        self.Args = collections.namedtuple(f"{fn.fn.__name__.strip('_')}_args", names)
        params = getattr(fn, "params", None)  # None under the interpreter (an InterpretedFunction)
        self._kinds = None if params is None else tuple(
            "constexpr" if p.is_constexpr else ("int" if p.do_not_specialize else "int_specialized") for p in params)
        self._key = None if params is None else _key_function(self._kinds)
        self._compiled = {}
        self._direct = triton.__version__.startswith(DIRECT_TRITON)

    def __call__(self, grid, args, **options):
        if type(args) is not self.Args:
            raise TypeError(f"{self.fn.fn.__name__} takes its arguments as {self.Args.__name__}(name=value, ...) "
                            f"(FastLaunch.Args), got {type(args).__name__}")
        if self._kinds is None or not self._direct or _hooks_installed():
            self.fn[grid](*args, **options)
            return
        key = self._key(torch._C._cuda_getDevice(), tuple(options.items()), *args)  # current_device() sans lazy init
        kernel = self._compiled.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, **options)
            if hasattr(kernel, "packed_metadata"):
                self._compiled[key] = kernel
            return
        g0, g1, g2 = (*grid, 1, 1)[:3]
        stream = torch._C._cuda_getCurrentRawStream(key[0])
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *args)
