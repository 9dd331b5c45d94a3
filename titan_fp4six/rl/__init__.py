"""GRPO reinforcement learning on the converted torchtitan model (see README, "RL (GRPO)").

torchtitan-free: `consistent` (batch-invariant kernels), `forward` (the model's forward with a KV cache),
`experts` (expert weights quantized once per refresh), `generator`, `task`, `grpo` (advantages, loss,
mismatch). torchtitan-dependent: `job_config` (the [rl] section), `trainer` and `__main__` (the entry point).
"""
