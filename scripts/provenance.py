"""Where a results page's figures come from, for its header: the commit and the machine they were measured on."""

import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commit(fallback: str = "unknown (not a git checkout)") -> str:
    """HEAD's short hash, marked when tracked files have uncommitted changes other than the results being written
    (docs/results/, docs/fidelity/); `fallback` outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results",
                                ":!docs/fidelity"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return fallback
    return head + (" (with uncommitted changes)" if dirty else "")


def machine() -> str:
    """OS, architecture, CPU model and cores, GPU, torch and torchtitan versions."""
    import torch
    import torchtitan

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.system()} {platform.machine()}, {cpu} ({os.cpu_count()} cores), {gpu}, torch "
            f"{torch.__version__}, torchtitan {getattr(torchtitan, '__version__', '?')}")
