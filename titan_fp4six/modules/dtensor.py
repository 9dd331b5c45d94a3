"""Plain local weights for the quantizers, whatever parallelism wrapped the parameter.

FSDP2 (1-D or HSDP) hands modules plain unsharded tensors during forward, so nothing is needed there.
Expert parallelism leaves expert weights as DTensors sharded on the expert dim (Shard(0)): the local
tensor is the full weight of each local expert, which is what gets quantized. Any other sharding (tensor
parallelism) would make the per-tensor amax a per-shard one and change numerics, so it is refused.
"""

import sys

import torch


def is_dtensor(t) -> bool:
    """isinstance(t, DTensor) without importing torch.distributed.tensor (most of `import titan_fp4six`'s
    time): a DTensor can only exist once that module has been imported by whoever built it."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local_weight(weight: torch.Tensor, name: str, *, experts: bool = False) -> torch.Tensor:
    """Return the tensor to quantize: `weight` itself, or its local shard when that holds whole matrices."""
    if not is_dtensor(weight):
        return weight
    from torch.distributed.tensor import Replicate, Shard
    allowed = (Replicate(), Shard(0)) if experts else (Replicate(),)
    bad = [p for p in weight.placements if p not in allowed]
    if bad:
        raise NotImplementedError(
            f"{name} is a DTensor with placements {weight.placements} on mesh "
            f"{weight.device_mesh.mesh_dim_names}; four-over-six needs whole weight matrices per rank "
            f"({'Shard(0) over experts or ' if experts else ''}Replicate). Tensor parallelism on these "
            "weights is not supported: set parallelism.tensor_parallel_degree / "
            "expert_tensor_parallel_degree to 1.")
    return weight.to_local()
