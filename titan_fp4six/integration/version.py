"""Which torchtitan integration runs: picked by the installed torchtitan's version, with no torchtitan import.

torchtitan 0.2.x reads TOML recipes (`--job.config_file`) and converts built modules (converters.py, job_config.py);
0.3.x builds runs from registry functions (`--module ... --config ...`) and converts model configs (tt03/). Any
other version is refused by name, before an import error from deep inside torchtitan would say less.
"""

from importlib import metadata

SUPPORTED = {"0.2": "torchtitan 0.2.x (--job.config_file configs/<recipe>.toml)",
             "0.3": "torchtitan 0.3.x (--module titan_fp4six.integration.tt03 --config <recipe>)"}


def installed() -> str:
    """The installed torchtitan's version string."""
    try:
        return metadata.version("torchtitan")
    except metadata.PackageNotFoundError:
        raise ImportError(f"torchtitan is not installed; titan_fp4six supports {', '.join(SUPPORTED.values())}: "
                          "bash scripts/setup.sh (0.2), then bash scripts/setup_tt03.sh for 0.3") from None


def series(version: str | None = None) -> str:
    """'0.2' or '0.3' for the installed (or given) torchtitan version; any other is an error naming both."""
    version = installed() if version is None else version
    key = ".".join(version.split(".")[:2])
    if key not in SUPPORTED:
        raise ImportError(f"torchtitan {version} is installed; titan_fp4six supports {', '.join(SUPPORTED.values())}")
    return key


def require(wanted: str, what: str, instead: str | None = None) -> None:
    """Refuse to load `what` (a module or tool for one series) next to another torchtitan, naming the right entry
    (`instead`, default the other series' training entry)."""
    have = series()
    if have != wanted:
        raise ImportError(f"{what} is the integration for torchtitan {wanted}.x, but torchtitan {installed()} is "
                          f"installed: use {instead or SUPPORTED[have]}")


def trainer_config(trainer):
    """The run's config held by a torchtitan Trainer: 0.2 keeps it as `job_config`, 0.3 as `config` (the
    plugin's trainer mixins serve both)."""
    return trainer.job_config if hasattr(trainer, "job_config") else trainer.config
