"""``python -m titan_fp4six.train``: torchtitan.train with the titan_fp4six plugin, on the CPU when there is no GPU.

Same CLI as the installed ``torchtitan.train``: 0.2.x ``--job.config_file recipe.toml --section.key value``, 0.3.x
``--module titan_fp4six.integration.tt03 --config <recipe> --section.key value`` (the integration is picked by the
installed version; another version is an error naming both). Runnable under torchrun or as a single process (the
rendezvous variables torchrun would set are filled in for one rank).
"""

import importlib
import os
import socket
import sys

import torch


def use_argv(argv: list[str] | None) -> None:
    """Hand `argv` (the trainer's arguments; None: the command line's) to torchtitan, which reads sys.argv: 0.2
    binds sys.argv[1:] when its config module is first imported, so a given argv must come before that."""
    if argv is None:
        return
    sys.argv = [sys.argv[0], *argv]
    manager = sys.modules.get("torchtitan.config.manager")
    bound = getattr(getattr(manager, "ConfigManager", None), "parse_args", None)
    if bound is not None and bound.__defaults__ and bound.__defaults__[0] not in (None, list(argv)):
        raise RuntimeError("main(argv): torchtitan was imported first and keeps the command line it saw then; call "
                           "main(argv) in a fresh process (or put the arguments on its command line)")


def _single_process_env() -> None:
    """Let a plain ``python -m`` run act as rank 0 of 1, as ``torchrun --nproc_per_node=1`` would."""
    if "LOCAL_RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


def check_world_size(parallelism, world_size: int) -> None:
    """torchtitan asserts that the parallel degrees multiply to WORLD_SIZE, with a bare AssertionError when
    data_parallel_shard_degree = -1 is left no processes (e.g. tensor_parallel_degree 2 in one process)."""
    p = parallelism
    degrees = {"data_parallel_replicate_degree": p.data_parallel_replicate_degree,
               "data_parallel_shard_degree": p.data_parallel_shard_degree,
               "context_parallel_degree": p.context_parallel_degree,
               "tensor_parallel_degree": p.tensor_parallel_degree,
               "pipeline_parallel_degree": p.pipeline_parallel_degree}
    fixed = 1
    for name, degree in degrees.items():
        fixed *= degree if name != "data_parallel_shard_degree" or degree > 0 else 1
    fits = world_size % fixed == 0 if p.data_parallel_shard_degree < 0 else fixed == world_size
    if not fits:
        listed = " x ".join(f"parallelism.{k}={v}" for k, v in degrees.items())
        raise ValueError(f"{listed} needs {fixed} processes (-1 takes what is left) but WORLD_SIZE={world_size}: "
                         f"launch {fixed} with `torchrun --nproc_per_node={fixed} -m titan_fp4six.train ...` or "
                         "lower the degrees")


def prepare_process(series: str = "0.2") -> None:
    """What the launchers (this one and ``titan_fp4six.rl``) do before torchtitan starts, for 4/6 runs and bf16
    twins alike (so their ratios share the settings): bad environment overrides (TITAN_FP4SIX_QUANTIZER,
    TITAN_FP4SIX_EMULATE) stop it before anything starts; the allocator's expandable segments (before any CUDA
    allocation), the CPU patches without a GPU, the rendezvous of one rank, backward on this thread. torchtitan
    0.2 (`series`): the embedded corpus and the plugin's flavors (also for recipes without the plugin's config
    module); 0.3: its own CPU patches and what its torch lacks (compat), the registry adds the data."""
    from titan_fp4six.integration.allocator import expandable_segments_by_default
    from titan_fp4six.integration.backward_thread import run_backward_on_calling_thread
    from titan_fp4six.quant.backends import environment_overrides

    environment_overrides()
    expandable_segments_by_default()
    if series == "0.3":
        from titan_fp4six.integration.tt03 import compat, cpu

        if not torch.cuda.is_available():
            cpu.apply()
        compat.apply()
    elif not torch.cuda.is_available():
        from titan_fp4six.integration import cpu

        cpu.apply()
    _single_process_env()
    run_backward_on_calling_thread()
    if series == "0.2":
        from titan_fp4six.integration import data, flavors  # after the CPU patches: torchtitan's models load here

        data.register()
        flavors.register()


def import_custom_module(job_config) -> None:
    """torchtitan's Trainer imports experimental.custom_import first thing; the checks must see what it registers
    (a flavor, a model), so they import it first, naming the key when it is not importable."""
    name = getattr(getattr(job_config, "experimental", None), "custom_import", "")
    if name:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ValueError(f"experimental.custom_import={name!r} is not importable ({type(e).__name__}: {e}); "
                             "name a module on PYTHONPATH") from e


def check_before_training(job_config) -> None:
    """Both launchers' checks of the parsed config, before torchtitan's Trainer builds anything."""
    from titan_fp4six.integration.checks import check_job_config
    from titan_fp4six.integration.nonfinite import nonfinite_allowed

    import_custom_module(job_config)
    check_job_config(job_config)
    nonfinite_allowed(job_config.training)
    check_world_size(job_config.parallelism, int(os.environ["WORLD_SIZE"]))


def main(argv: list[str] | None = None) -> int:
    """Train: torchtitan's main with the checks and the plugin's set-up; `argv` the trainer's arguments (default
    the command line's). 0 when training ends; failures raise, as torchtitan's do."""
    use_argv(argv)
    from titan_fp4six.integration.version import series

    if series() == "0.3":
        prepare_process("0.3")
        from torchtitan.train import main as torchtitan_main

        torchtitan_main()
        return 0
    prepare_process()
    from torchtitan.train import Trainer
    from torchtitan.train import main as torchtitan_main

    from titan_fp4six.integration.dump_lock import lock_dump_folder
    from titan_fp4six.integration.nonfinite import NonFiniteStop
    from titan_fp4six.integration.rounding import RoundingSeedPerStep

    class CheckedTrainer(RoundingSeedPerStep, NonFiniteStop, Trainer):
        """torchtitan's Trainer after the checks whose torchtitan failures are bare (KeyError, AssertionError) or
        silent, stopping at a non-finite loss or grad norm (training.allow_nonfinite)."""

        def __init__(self, job_config):
            check_before_training(job_config)
            lock_dump_folder(job_config.job.dump_folder)
            super().__init__(job_config)

    torchtitan_main(CheckedTrainer)
    return 0


def exit_after_run(code: int) -> None:
    """End a launcher's process once its run has returned, without Python's finalization: the process group
    outlives destroy_process_group in torch's caches (DTensor's sharding cache holds its meshes), so gloo's threads
    run on into finalization, and one that drops a finished collective's last tensors then takes the GIL and
    aborts the process ("terminate called without an active exception", exit status -6) after a run that
    succeeded (seen in about 1 of 30 two-rank CPU runs under load). Files are closed by then (torchtitan's close,
    the launchers' own writes); output and logging are flushed here. A run that leaves Python threads running
    exits through Python, which waits for them. Only `python -m` ends this way: the console scripts
    (titan-fp4six-train) exit through Python."""
    import logging
    import threading

    if any(t is not threading.current_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)  # Python threads still at work (an asynchronous checkpoint's writer): Python's exit joins them
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_after_run(main())
