"""The whole-config checks the launchers (and the dry run) make before torchtitan builds anything.

Why here: torchtitan reports these late, barely or never (a KeyError for a flavor or converter name, a silent
bf16 run for a section without its converter), and the checks need more than one section, which no section can
check when the config loads.
"""

from .converters import check_converter_names, check_sections_have_converters
from .flavors import check_flavor


def check_job_config(job_config) -> None:
    check_converter_names(job_config)
    check_sections_have_converters(job_config)
    check_flavor(job_config)
    check_seed(job_config)


def check_seed(job_config) -> None:
    """torch.manual_seed takes a signed 64-bit seed; torchtitan hands it debug.seed unchecked (an overflow
    error from inside torch that names neither the key nor the range)."""
    seed = getattr(getattr(job_config, "debug", None), "seed", None)
    if seed is not None and not -2 ** 63 <= seed < 2 ** 63:
        raise ValueError(f"debug.seed={seed}: torch's generators take a seed in [-2**63, 2**63)")

