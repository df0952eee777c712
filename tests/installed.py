"""The Python tests' guard: each runs against the pip-installed packages, not the checkout's
python/ (tools/check-talker.sh and tools/check-agents.sh install them into a fresh venv)."""

import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1] / "python"


def installed(*modules, script):
    """Exits unless each module is the pip-installed one; `script` is the check that installs them."""
    for module in modules:
        if CHECKOUT in Path(module.__file__).resolve().parents:
            sys.exit(f"{module.__name__} comes from the checkout ({module.__file__}), not from "
                     f"the installed package: run {script}")
