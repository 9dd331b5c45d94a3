"""The CPU adjustments torchtitan 0.2.2 needs (0.3: tt03/cpu.py, sharing the helpers here) to train with no accelerator, applied by ``apply()`` in one place.

Why: torchtitan picks "cuda" when no accelerator is present and fails at ``set_device``; its memory monitor asks
``torch.cuda`` for memory statistics; MoE token permutation runs a Triton kernel unless told to use its CPU path;
``torch.histc`` has no integer CPU kernel; and with FSDP2 torchtitan sets a gradient divide factor of 1.0, which
FSDP2 turns into a ``ReduceOp.PREMUL_SUM(1.0)`` reduce-scatter that gloo rejects. ``titan_fp4six.train`` calls
``apply()`` only when CUDA is not available, so GPU runs are untouched. Each patch keeps numerics: the permutation's CPU path fills the same
indices, token counts below 2**24 are exact in float32, and a SUM reduce-scatter equals a PREMUL_SUM by 1.0.
"""

import functools
import os
import platform
import types

import torch

_applied = False


def _read_status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (platform.processor() or platform.machine())


def _reset_peak_rss() -> None:
    """Linux resets the process's peak resident set size (VmHWM) on writing 5 to clear_refs."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _memory_stats(device=None) -> dict[str, int]:
    """Peak resident memory of this process, in the keys torchtitan's DeviceMemoryMonitor reads."""
    peak = _read_status_kib("VmHWM") * 1024
    return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak, "num_alloc_retries": 0, "num_ooms": 0}


def _device_module() -> types.SimpleNamespace:
    """``torch.cpu`` plus the ``torch.cuda``-style memory calls torchtitan makes, answered for host memory."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return types.SimpleNamespace(
        set_device=torch.cpu.set_device, current_device=lambda: 0,
        device_count=torch.cpu.device_count, synchronize=torch.cpu.synchronize, is_available=lambda: True,
        get_device_name=lambda device=None: _cpu_name(),
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=total, name=_cpu_name()),
        memory_stats=_memory_stats, reset_peak_memory_stats=lambda device=None: _reset_peak_rss(),
        empty_cache=lambda: None,
    )


def _histc_float_on_cpu(histc):
    @functools.wraps(histc)
    def wrapper(input, *args, **kwargs):
        if input.device.type == "cpu" and not input.is_floating_point():
            return histc(input.float(), *args, **kwargs).to(input.dtype)  # integer counts, as CUDA returns
        return histc(input, *args, **kwargs)

    return wrapper


def sum_reductions(disable_division):
    """FSDP2 reduce-scatters with plain SUM (gloo has no PREMUL_SUM); the divide factor stays torchtitan's 1.0."""
    from torch.distributed.fsdp import FSDPModule

    @functools.wraps(disable_division)
    def wrapper(model):
        disable_division(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    return wrapper


def point_at_cpu(modules) -> None:
    """Device type "cpu" and host-memory statistics in every torchtitan module that imported torchtitan's
    `device_type` / `device_module` at import time (both versions)."""
    device_module = _device_module()
    for module in modules:
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = device_module


def apply() -> None:
    """Point torchtitan at the CPU (idempotent). Call before building the Trainer, only when there is no GPU."""
    global _applied
    if _applied:
        return
    import torchtitan.components.metrics as metrics
    import torchtitan.distributed.parallel_dims as parallel_dims
    import torchtitan.distributed.utils as dist_utils
    import torchtitan.models.llama3.infra.parallelize as llama3_parallelize
    import torchtitan.models.llama4.infra.parallelize as llama4_parallelize
    import torchtitan.models.moe.kernels as moe_kernels
    import torchtitan.models.moe.utils as moe_utils
    import torchtitan.tools.profiling as profiling
    import torchtitan.tools.utils as tt_utils

    # 1. device type "cpu" (gloo follows from it in init_distributed) and host-memory statistics
    point_at_cpu((tt_utils, metrics, dist_utils, parallel_dims, profiling))
    # 2. token permutation on its CPU path (the default launches a Triton kernel)
    moe_utils.generate_permute_indices = functools.partial(moe_kernels.generate_permute_indices, use_cpu=True)
    # 3. torch.histc of expert indices: computed on float input (CPU has no integer kernel), counts cast back
    torch.histc = _histc_float_on_cpu(torch.histc)
    # 4. FSDP2 gradient reduce-scatter as SUM (gloo); llama4's apply_fsdp (DeepSeek-V3, Qwen3) imported the name
    for module in (llama3_parallelize, llama4_parallelize):
        module.disable_fsdp_gradient_division = sum_reductions(module.disable_fsdp_gradient_division)
    _applied = True
