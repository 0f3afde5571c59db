"""Where the pieces of vmmipc are, wherever this package is installed.

Three layouts: a wheel (`pip install .`: libvmmipc.so and vmmipc-config inside this
package, the sitecustomize hook in vmmipc/_site, the simulated driver and the demo's
peer in vmmipc/_sim), a cmake --install tree (share/vmmipc/python/vmmipc, the library
in lib/, vmmipc-config in bin/, no simulator), and a source tree (python/vmmipc, both
built in $BUILD_DIR/csrc, the simulator in $BUILD_DIR/sim).
"""

import os
import sysconfig

LIBRARY_NAME = "libvmmipc.so"
TOOL_NAME = "vmmipc-config"
SIM_DRIVER_NAME = "libcuda.so.1"  # the simulated driver, under the real one's name
PEER_NAME = "vmmipc_peer"


def package_dir():
    """The folder of this module: the vmmipc package, wherever it is installed."""
    return os.path.dirname(os.path.realpath(__file__))


def _tree_root(directory, *tail):
    """The folder that holds `directory` as root/tail[0]/tail[1]/..., or None."""
    parts = os.path.normpath(directory).split(os.sep)
    if len(parts) <= len(tail) or tuple(parts[-len(tail):]) != tail:
        return None
    return os.sep.join(parts[:-len(tail)]) or os.sep


def _install_prefix():
    """The prefix of a cmake --install tree around this package, or None."""
    return _tree_root(package_dir(), "share", "vmmipc", "python", "vmmipc")


def _source_build_dir():
    """$BUILD_DIR/csrc of the source tree around this package, or None."""
    if _install_prefix():
        return None
    root = _tree_root(package_dir(), "python", "vmmipc")
    if not root or not os.path.isfile(os.path.join(root, "CMakeLists.txt")):
        return None
    build_dir = os.environ.get("BUILD_DIR", "build")  # as scripts/*.sh use it
    return os.path.join(root, build_dir, "csrc")


def library_candidates():
    """Where libvmmipc.so is looked for: inside this package (a wheel), then the lib
    folders of an install prefix, then the build folder of a source tree."""
    found = [os.path.join(package_dir(), LIBRARY_NAME)]
    prefix = _install_prefix()
    if prefix:
        libdirs = ["lib", "lib64"]
        multiarch = sysconfig.get_config_var("MULTIARCH")
        if multiarch:
            libdirs.append(os.path.join("lib", multiarch))
        found += [os.path.join(prefix, d, LIBRARY_NAME) for d in libdirs]
    build = _source_build_dir()
    if build:
        found.append(os.path.join(build, LIBRARY_NAME))
    return found


def _first_file(candidates):
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path)
    return None


def find_library(explicit):
    """(absolute path or None, places looked at)."""
    if explicit:
        path = os.path.abspath(explicit)
        return (path if os.path.isfile(path) else None), [path]
    candidates = library_candidates()
    return _first_file(candidates), candidates


def find_tool(library=None):
    """vmmipc-config: (absolute path or None, places looked at). Beside `library`
    first (the build tree and the wheel keep them together), then where this
    package's layout puts it."""
    candidates = []
    if library:
        candidates.append(os.path.join(os.path.dirname(os.path.abspath(library)), TOOL_NAME))
    candidates.append(os.path.join(package_dir(), TOOL_NAME))
    prefix = _install_prefix()
    if prefix:
        candidates.append(os.path.join(prefix, "bin", TOOL_NAME))
    build = _source_build_dir()
    if build:
        candidates.append(os.path.join(build, TOOL_NAME))
    unique = list(dict.fromkeys(candidates))
    found = [path for path in unique if os.path.isfile(path) and os.access(path, os.X_OK)]
    return (found[0] if found else None), unique


def simulator():
    """(folder of the simulated libcuda.so.1, path of vmmipc_peer) for the demo, or None:
    the wheel's vmmipc/_sim, else the source tree's build. Only `python -m vmmipc demo`
    asks: the folder is put in LD_LIBRARY_PATH of the demo's own children, and never
    anywhere else, so that the simulator cannot stand in for the real driver."""
    places = [(os.path.join(package_dir(), "_sim"), os.path.join(package_dir(), "_sim"))]
    build = _source_build_dir()
    if build:
        root = os.path.dirname(build)
        places.append((os.path.join(root, "sim"), os.path.join(root, "tests", "e2e")))
    for sim_dir, peer_dir in places:
        peer = os.path.join(peer_dir, PEER_NAME)
        if os.path.isfile(os.path.join(sim_dir, SIM_DRIVER_NAME)) and os.access(peer, os.X_OK):
            return os.path.abspath(sim_dir), os.path.abspath(peer)
    return None


def source_root():
    """The source tree around this package (it has scripts/demo.sh), or None."""
    if _install_prefix():
        return None
    root = _tree_root(package_dir(), "python", "vmmipc")
    if root and os.path.isfile(os.path.join(root, "scripts", "demo.sh")):
        return root
    return None


def python_dir():
    """The folder to put on PYTHONPATH for --deepep: the one holding the vmmipc
    sitecustomize hook (with the package beside it in a source or install tree; in a
    wheel the hook is in vmmipc/_site and the package is already importable)."""
    here = package_dir()
    for path in (os.path.join(here, "_site"), os.path.dirname(here)):
        if os.path.isfile(os.path.join(path, "sitecustomize.py")):
            return path
    return None
