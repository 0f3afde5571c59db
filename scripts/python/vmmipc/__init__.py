"""vmmipc: Python helpers around the libvmmipc.so preload.

The library itself needs no Python: it is loaded with LD_PRELOAD (see
scripts/vmmipc-run) and works below every CUDA client. This package holds
optional framework integrations:

  vmmipc.deepep   make DeepEP's NVL buffer take the legacy IPC path
                  (cudaIpcGetMemHandle), which vmmipc serves on VMM memory

and small helpers they share. Nothing here imports torch or a framework until
an integration is installed.
"""

import os
import sys

__version__ = "0.1.0"


def rank_label(environ=None):
    """The rank part of a log prefix, chosen as the library chooses its rank."""
    environ = os.environ if environ is None else environ
    for name in ("VMMIPC_RANK", "LOCAL_RANK", "RANK"):
        text = environ.get(name, "").strip()
        if text.isdigit() and int(text) <= 0xFFFE:
            return f"rank {int(text)}"
    return "unranked"


def log(level, message):
    """One line on stderr, tagged like the library's own lines."""
    sys.stderr.write(f"[vmmipc pid {os.getpid()} {rank_label()}] {level}: {message}\n")
    sys.stderr.flush()
