#!/usr/bin/env bash
# A venv at DIR that sees every package of the Python PY (a venv or the system's), after its own: a .pth file runs
# site.addsitedir on PY's site-packages (so their own .pth files, the plugin's editable install among them, run
# too). Packages installed into DIR shadow PY's; `DIR/parent-python` names PY. Rebuilt when PY changes.
# Refuses, naming them, when PY lacks the modules listed after DIR.
#   bash scripts/layered_venv.sh PY DIR [module ...]
set -euo pipefail
PY=$1 DIR=$2
shift 2
missing=$("$PY" - "$@" <<'PYEOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
PYEOF
)
if [ -n "$missing" ]; then
  echo "$DIR needs these importable by $PY first: $missing (run scripts/setup.sh with this Python)" >&2
  exit 1
fi
parent=$("$PY" -c "import sys; print(sys.executable)")
[ -x "$DIR/bin/python" ] && [ "$(cat "$DIR/parent-python" 2>/dev/null)" = "$parent" ] && exit 0
rm -rf "$DIR"
"$PY" -m venv "$DIR"
"$DIR/bin/python" - "$parent" <<'PYEOF'
import subprocess, sys, sysconfig
from pathlib import Path

parent = sys.argv[1]
dirs = subprocess.run([parent, "-c", "import site; print('\\n'.join(site.getsitepackages()))"],
                      capture_output=True, text=True, check=True).stdout.split()
Path(sysconfig.get_paths()["purelib"], "parent_site_packages.pth").write_text(
    "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
Path(sys.prefix, "parent-python").write_text(parent + "\n")
PYEOF
