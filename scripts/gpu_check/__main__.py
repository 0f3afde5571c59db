"""python3 scripts/gpu_check {gpu,framework} ... (from the repository root, or anywhere)."""

import os
import sys

if __package__ in (None, ""):  # run as a folder: make the package importable by its name
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpu_check.cli import main  # noqa: E402  (after the path is set)

sys.exit(main(sys.argv[1:]))
