"""The GEMM ops' bodies as torch.library custom ops for torch.compile, called directly in eager mode.

torch.compile needs each op opaque (Inductor must not re-associate the quantizer arithmetic); eager code gets
nothing from the custom-op layer but its host cost (~60 us a call on an H200 host: dispatcher, schema and
alias checks). So an op runs its body directly unless torch.compile is tracing; both are the same function,
hence the same bytes. Under torch.profiler the eager call still shows under the op's name (a range opened
only while a profiler runs).
"""

import torch


class CompileOpaqueOp:
    """`op(*args)`: the body in eager mode, `torch.ops.titan_fp4six.<name>` while torch.compile traces."""

    def __init__(self, name: str, body):
        self.qualname = f"titan_fp4six::{name}"
        self.body = body
        self.custom_op = torch.library.custom_op(self.qualname, mutates_args=())(body)
        self.register_fake = self.custom_op.register_fake

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.custom_op(*args)
        if not torch.autograd._profiler_enabled():  # a record_function range costs ~6 us even with no profiler
            return self.body(*args)
        with torch.profiler.record_function(self.qualname):
            return self.body(*args)


def compile_opaque_op(name: str):
    """Decorator: `@compile_opaque_op("dense_fwd")` over the op's body (annotated like a custom op)."""
    return lambda body: CompileOpaqueOp(name, body)
