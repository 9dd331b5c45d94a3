"""`import titan_fp4six` is quiet and light: no torchao (whose compiled extensions may not match the installed
torch and print load failures), no torchtitan, no torch.distributed.tensor until a DTensor exists."""

import subprocess
import sys

PROBE = """
import sys
import titan_fp4six
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torchao', 'torchtitan', 'triton')
               or m.startswith('torch.distributed.tensor'))
print(','.join(heavy))
"""


def test_import_prints_nothing_and_loads_no_heavy_modules():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.strip() == ""
