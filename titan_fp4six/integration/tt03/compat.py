"""What torchtitan 0.3.0 needs from torch that torch 2.13 (and the 2.11 of the GPU machine) lacks.

torchtitan 0.3.0 pins no torch version, but after the first step it shortens the collective timeout with
`torch.distributed.set_timeout`, which these torch releases do not have (AttributeError, the run dies). Without it
the launcher keeps the timeout torchtitan started with (`comm.init_timeout_seconds`) and says so once.
"""

import torch


def apply() -> None:
    """Patch torchtitan's set_pg_timeouts where torch has no set_timeout (idempotent)."""
    if hasattr(torch.distributed, "set_timeout"):
        return
    import torchtitan.distributed.utils as dist_utils
    from torchtitan.tools.logging import logger

    def set_pg_timeouts(timeout, parallel_dims) -> None:
        logger.warning(f"torch {torch.__version__} has no torch.distributed.set_timeout: the collective timeout stays "
                       f"comm.init_timeout_seconds instead of becoming {timeout} after the first step")

    dist_utils.set_pg_timeouts = set_pg_timeouts
