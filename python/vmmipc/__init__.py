"""vmmipc: Python helpers around the libvmmipc.so preload.

The library itself needs no Python: it is loaded with LD_PRELOAD (vmmipc-run,
or preload_env() below) and works below every CUDA client. This package holds
the launcher and optional framework integrations:

  vmmipc.run      the launcher: `vmmipc-run [options] -- CMD`, `vmmipc-run --check`
                  (vmmipc.check, vmmipc.check_driver, vmmipc.probe)
  vmmipc.settled  what the library settles in an environment, asked of vmmipc-config
  vmmipc.deepep   make DeepEP's NVL buffer take the legacy IPC path
                  (cudaIpcGetMemHandle), which vmmipc serves on VMM memory
  python -m vmmipc --lib        the path of the library (inside this package
                                after `pip install .`)
  python -m vmmipc --print-env  LD_PRELOAD for a shell: eval "$(python -m vmmipc --print-env)"
  python -m vmmipc --config     the settled configuration, as JSON

and small helpers they share. Nothing here imports torch or a framework until
an integration is installed.
"""

import os
import sys

__version__ = "0.1.0"

def log(level, message):
    """One line on stderr, tagged with the pid as the library's own lines are.
    Not with the rank: settling it means running vmmipc-config, a process in every
    worker that logs (DeepEP's, each rank); the library's lines of the same pid
    name the rank."""
    sys.stderr.write(f"[vmmipc pid {os.getpid()}] {level}: {message}\n")
    sys.stderr.flush()


def library_path():
    """The absolute path of libvmmipc.so that vmmipc-run would preload: inside this
    package after `pip install .`, else the install tree or the source tree's build.
    Raises FileNotFoundError, naming the places looked at, when there is none."""
    from vmmipc import paths

    path, looked_at = paths.find_library(None)
    if path is None:
        raise FileNotFoundError(f"{paths.LIBRARY_NAME} not found (looked at: "
                                f"{', '.join(looked_at)})")
    return path


def preload_env(environ=None, library=None):
    """A copy of `environ` (default os.environ) with libvmmipc.so first in LD_PRELOAD,
    for a subprocess: subprocess.run(cmd, env=vmmipc.preload_env()). Other preloads are
    kept in order; another libvmmipc.so is dropped. VMMIPC_* variables are left as
    they are (set them in the returned mapping)."""
    from vmmipc import preload

    env = dict(os.environ if environ is None else environ)
    env["LD_PRELOAD"] = preload.prepend_preload(env.get("LD_PRELOAD"),
                                                library or library_path())
    return env
