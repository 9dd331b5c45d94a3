"""Launch a Triton kernel through its compiled launcher, skipping Triton's per-call argument binding.

`kernel[grid](...)` binds and specializes every argument in Python on each call: 30-70 us of host time per
launch on the H200 machine's host, against ~13 us for the compiled launcher alone (measured). The ops launch
several kernels per GEMM, so on the small GEMMs of debug models that host time, not the GPU, set the step time.

FastLaunch goes through `kernel[grid](...)` the first time it meets a specialization (Triton compiles, caches
and launches as usual) and keeps the compiled kernel Triton returns; later calls with the same specialization
call that kernel's launcher with the same arguments, as Triton's own launch path does. The specialization key
is at least as fine as Triton's: constexpr values, each tensor's dtype and 16-byte alignment, each integer's
width (and, unless the kernel says do_not_specialize, whether it is 1 or a multiple of 16), the launch options
and the device. Under the Triton interpreter, or while launch hooks are installed (profilers such as proton),
every call takes Triton's own path.
"""

import torch

MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension
COMPILE_OPTIONS = {"enable_fp_fusion": False}  # the spec rounds each operation: no contraction of a*b + c into an FMA

try:
    from triton import knobs as _knobs
except ImportError:  # older Triton: no hooks object to consult; never take the direct path
    _knobs = None


def _hooks_installed() -> bool:
    """Whether launch hooks are installed (None or an empty HookChain, by Triton version, means none)."""
    if _knobs is None:
        return True
    return any(hook is not None and bool(getattr(hook, "calls", True))
               for hook in (_knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook))


def _int_key(value: int, specialized: bool):
    width = -2 ** 31 <= value < 2 ** 31
    return (width, value == 1, value % 16 == 0) if specialized else width


class FastLaunch:
    """`FastLaunch(jit_fn)(grid, *args, **options)` == `jit_fn[grid](*args, **options)` with every parameter
    passed positionally in the kernel's signature order (constexprs included)."""

    def __init__(self, fn):
        self.fn = fn
        params = getattr(fn, "params", None)  # None under the interpreter (an InterpretedFunction)
        self._kinds = None if params is None else tuple(
            "constexpr" if p.is_constexpr else ("int" if p.do_not_specialize else "int_specialized") for p in params)
        self._compiled = {}

    def _key(self, args, options):
        key = [torch.cuda.current_device(), tuple(options.items())]
        for kind, arg in zip(self._kinds, args):
            if kind == "constexpr":
                key.append(arg)
            elif isinstance(arg, torch.Tensor):
                key.append((arg.dtype, arg.data_ptr() % 16 == 0))
            elif isinstance(arg, bool) or not isinstance(arg, int):
                key.append(type(arg))
            else:
                key.append(_int_key(arg, kind == "int_specialized"))
        return tuple(key)

    def __call__(self, grid, *args, **options):
        if self._kinds is None or len(args) != len(self._kinds) or _hooks_installed():
            self.fn[grid](*args, **options)
            return
        key = self._key(args, options)
        kernel = self._compiled.get(key)
        if kernel is None:
            kernel = self.fn[grid](*args, **options)
            if hasattr(kernel, "packed_metadata"):
                self._compiled[key] = kernel
            return
        g0, g1, g2 = (*grid, 1, 1)[:3]
        stream = torch._C._cuda_getCurrentRawStream(key[0])
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *args)
