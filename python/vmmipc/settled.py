"""The configuration libvmmipc.so would settle, asked of vmmipc-config.

The library's rules (the variables of csrc/config/params.def and their checks, the
address layout, the rank and its fallbacks, the slot a GPU gives, the socket
directory rule) are written once, in C++; vmmipc-config, built from the same code
and installed beside the library, prints what they settle to as JSON. The launcher
and `python -m vmmipc` read that instead of keeping a copy.
"""

import json
import subprocess

from vmmipc import paths
from vmmipc.preload import without_vmmipc


class ToolError(Exception):
    """vmmipc-config cannot be found, or did not answer."""


class Settled:
    """One answer of vmmipc-config (docs/configuration.md lists its fields)."""

    def __init__(self, document):
        self.document = document
        self.variables = {v["name"]: v for v in document["variables"]}
        self.layout = document["layout"]
        self.rank_info = document["rank"]
        self.sockets = document["sockets"]
        self.gpus = document["gpus"]
        self.warnings = document["warnings"]
        self.unknown = document["unknown_variables"]

    def __getitem__(self, name):
        """The settled value of a VMMIPC_* variable (bool, int or str by its kind)."""
        return self.variables[name]["value"]

    def text(self, name):
        """The settled value as the variable would be set ("info", "0x300000000000")."""
        return self.variables[name]["text"]

    def error(self, name):
        """Why the variable's own text was not used (the library's warning), or None."""
        return self.variables[name]["error"]

    @property
    def rank(self):
        return self.rank_info["rank"]

    @property
    def rank_source(self):
        return self.rank_info["source"]


def settle(env, pci=(), library=None, timeout_s=30):
    """What the library settles in `env` (a mapping), with the slot of each GPU whose
    PCI address is in `pci`. Raises ToolError when vmmipc-config is missing or fails."""
    tool, looked_at = paths.find_tool(library)
    if tool is None:
        raise ToolError(f"{paths.TOOL_NAME} not found (looked at: {', '.join(looked_at)})")
    command = [tool]
    for address in pci:
        command += ["--pci", address]
    try:
        child = subprocess.run(command, env=without_vmmipc(env), capture_output=True,
                               timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolError(f"{tool} did not run: {error}") from None
    if child.returncode != 0:
        why = f"exit status {child.returncode}" if child.returncode > 0 \
            else f"signal {-child.returncode}"
        tail = child.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise ToolError(f"{tool} failed ({why}) {tail[0]}".strip())
    # Values are the environment's bytes: whatever they are, they come back as they were.
    try:
        return Settled(json.loads(child.stdout.decode("utf-8", "surrogateescape")))
    except (ValueError, KeyError) as error:
        raise ToolError(f"{tool} printed no report: {error}") from None
