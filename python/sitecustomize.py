"""sitecustomize of vmmipc's Python integrations.

`vmmipc-run --deepep` puts this folder on PYTHONPATH (python/ of a source tree, share/vmmipc/python,
or vmmipc/_site of a `pip install .`, whose vmmipc package is then the one installed
in that Python) and sets DEEPEP_VMMIPC=1;
Python then imports this file at start-up (the site module does), in every
process of the job, torchrun's workers included. With DEEPEP_VMMIPC=1 it
arranges for deep_ep.Buffer to be wrapped when the program imports deep_ep
(vmmipc.deepep); it imports nothing heavy itself.

A folder first on PYTHONPATH shadows any other sitecustomize (a distribution's
or a virtual environment's), so this one then runs the next one found on
sys.path. Not active under `python -S` or `-I`: use vmmipc.deepep.install().
"""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed_sitecustomize(here):
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    if spec.origin and os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _vmmipc_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from vmmipc import deepep

        deepep.install_from_environment()
    except Exception as error:  # start-up of every Python process must not break here
        sys.stderr.write(f"[vmmipc pid {os.getpid()}] error: vmmipc sitecustomize: {error!r}\n")
    _run_shadowed_sitecustomize(here)


_vmmipc_sitecustomize()
