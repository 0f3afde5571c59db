"""The launcher's words for what the user typed: an option's value the library would
refuse, a library that is not there, and where the documentation is.

What a value must be is the library's rule (csrc/config/params.def), asked of
vmmipc-config (vmmipc.settled): this module only says it as the user typed it,
`--rank: 'abc' is not a whole number`, not as the variable the option sets.
"""

from vmmipc import paths

# Where the project lives, for wheel users (who have no docs/ folder): the lead sets it
# together with pyproject.toml's [project.urls]. None: not known yet, and not shown.
PROJECT_URL = None

# The options whose value the library may refuse, by the variable they set.
CHECKED_OPTIONS = {"VMMIPC_RANK": "--rank", "VMMIPC_LOG_LEVEL": "--log-level"}


def refused(option, value, reason):
    """`--rank: 'abc' is not a whole number`: the library's reason, about the option."""
    if reason.startswith("not "):
        reason = "is " + reason
    return f"{option}: '{value}' {reason}"


def first_refused(changes, config):
    """The message for the first option whose variable the library would refuse, or None.
    `changes`: the variables the options set; `config`: vmmipc-config's answer."""
    for name, option in CHECKED_OPTIONS.items():
        if name in changes and config.error(name):
            reason = config.variables[name].get("reason") or config.error(name)
            return refused(option, changes[name], reason)
    return None


def library_missing(explicit, looked_at):
    """What to say, and do, when libvmmipc.so is not where it was looked for."""
    name = paths.LIBRARY_NAME
    if explicit:
        where = f"--lib {explicit}: no such file"
    else:
        where = f"{name} not found (looked at: {', '.join(looked_at)})"
    return (f"{where}. Installed with pip: reinstall the package (pip install "
            f"--force-reinstall vmmipc, or pip install . in its source tree) and leave --lib "
            f"out; `python -m vmmipc --lib` prints the library it finds. A source tree: build it "
            f"(scripts/setup.sh, or cmake --build $BUILD_DIR) or pass --lib "
            f"$BUILD_DIR/csrc/{name}")


def docs_pointer():
    """Where every variable is described, for --help: something every install has."""
    text = ("Every VMMIPC_* variable, its default and the values it accepts: vmmipc-run "
            "--variables (from the installed vmmipc-config); in a source tree also "
            "docs/configuration.md, and recipes in docs/recipes.md")
    if PROJECT_URL:
        text += f"; online: {PROJECT_URL}"
    return text + "."
