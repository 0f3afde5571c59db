"""LD_PRELOAD and PYTHONPATH as vmmipc edits them: libvmmipc.so first, once."""

import os
import re

from vmmipc.paths import LIBRARY_NAME


def split_preload(value):
    """The entries of an LD_PRELOAD value (ld.so separates them with colons or spaces)."""
    return [entry for entry in re.split(r"[: ]+", value or "") if entry]


def is_vmmipc(entry):
    return os.path.basename(entry) == LIBRARY_NAME


def prepend_preload(current, library):
    """LD_PRELOAD with `library` first, others kept in order, no second vmmipc."""
    kept = [entry for entry in split_preload(current) if not is_vmmipc(entry)]
    return ":".join([library] + kept)


def without_vmmipc(env):
    """A copy of `env` whose LD_PRELOAD has no libvmmipc.so: for the helpers the
    launcher runs (the driver probe, vmmipc-config), which must not be interposed."""
    copy = dict(env)
    copy["LD_PRELOAD"] = ":".join(e for e in split_preload(copy.get("LD_PRELOAD"))
                                  if not is_vmmipc(e))
    return copy


def prepend_path(current, directory):
    entries = [entry for entry in (current or "").split(":") if entry and entry != directory]
    return ":".join([directory] + entries)
