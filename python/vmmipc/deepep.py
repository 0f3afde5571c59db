"""vmmipc.deepep: DeepEP's NVL buffer through legacy CUDA IPC, and so through vmmipc.

DeepEP shares the NVLink buffer of deep_ep.Buffer between the ranks of a node
in one of two ways, picked by Buffer(..., use_fabric=...):

  use_fabric=True   cuMemCreate with a FABRIC handle, exported and imported as
                    such: needs an IMEX channel, which H100/H200 hosts usually
                    lack (cuMemCreate then fails with CUDA_ERROR_NOT_PERMITTED)
  use_fabric=False  cudaMalloc + cudaIpcGetMemHandle / cudaIpcOpenMemHandle:
                    legacy IPC, which vmmipc serves when that memory is VMM
                    memory (for example under a memory saver that turns
                    cudaMalloc into cuMemCreate)

install() wraps Buffer.__init__ so that every Buffer is built with
use_fabric=False and every other argument exactly as the framework passed it
(num_nvl_bytes, the size the framework computed, included).

The wrapper never breaks a job. Where there is nothing to change it logs one
line per process and passes every argument through untouched:
  - this DeepEP's Buffer.__init__ has no use_fabric parameter (DeepEP 2.x's
    legacy Buffer; 1.x releases before fabric support): it always shares the
    NVL buffer with cudaIpcGetMemHandle;
  - use_fabric is False already (DeepEP's default, or what the caller passed);
  - the signature cannot be read (a compiled Buffer): nothing is rewritten.
Arguments that do not fit the signature go to DeepEP unchanged, so the error a
caller sees is DeepEP's own. Only use_fabric=True is rewritten (to False).

Activation, either:
  - explicit, in the program:  import vmmipc.deepep; vmmipc.deepep.install()
  - from the environment: DEEPEP_VMMIPC=1 with python/ (of a source tree) on PYTHONPATH
    (what `vmmipc-run --deepep` sets); the sitecustomize there calls
    install_from_environment(), which patches deep_ep when it is imported.

Standard library only; torch and deep_ep are imported by the program, never here
before the program asks.
"""

import functools
import importlib.abc
import inspect
import os
import sys

from vmmipc import log

ENV_VARIABLE = "DEEPEP_VMMIPC"
_MARK = "__vmmipc_deepep_wrapped__"


class DeepEPVersionError(RuntimeError):
    """Kept so that code catching it still imports; vmmipc.deepep no longer raises it."""


def enabled(environ=None):
    """True when DEEPEP_VMMIPC asks for the integration (1, true, yes, on)."""
    environ = os.environ if environ is None else environ
    return environ.get(ENV_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


def _describe(buffer_class):
    module = sys.modules.get(buffer_class.__module__.split(".")[0])
    version = getattr(module, "__version__", None)
    where = getattr(module, "__file__", None) or buffer_class.__module__
    return f"deep_ep {version or '(version unknown)'} at {where}"


def _wrap_init(buffer_class, original):
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None
    has_use_fabric = signature is not None and "use_fabric" in signature.parameters
    said = set()  # the pass-through reasons already logged in this process: one line each
    self_placeholder = object()  # binds `self` without touching the instance

    def pass_through(reason):
        if reason not in said:
            said.add(reason)
            log("info", f"deep_ep.Buffer: {reason}; vmmipc.deepep passes every argument through "
                        f"unchanged ({_describe(buffer_class)})")

    def rewrite(args, kwargs):
        """(args, kwargs) to build the Buffer with: use_fabric=True becomes False."""
        if signature is None:
            pass_through("Buffer.__init__ has no readable signature")
            return args, kwargs
        if not has_use_fabric:
            pass_through("Buffer.__init__ has no use_fabric parameter, so this DeepEP shares the "
                         "NVL buffer with cudaIpcGetMemHandle already")
            return args, kwargs
        try:
            bound = signature.bind(self_placeholder, *args, **kwargs)
        except TypeError:
            return args, kwargs  # DeepEP raises its own error for these arguments
        asked = bound.arguments.get("use_fabric", signature.parameters["use_fabric"].default)
        if not asked:
            pass_through("use_fabric is False already")
            return args, kwargs
        bound.arguments["use_fabric"] = False
        nvl_bytes = bound.arguments.get("num_nvl_bytes")
        if nvl_bytes is None and "num_nvl_bytes" in signature.parameters:
            nvl_bytes = signature.parameters["num_nvl_bytes"].default
        if nvl_bytes:
            log("info", f"deep_ep.Buffer: use_fabric=False (asked: {asked}), num_nvl_bytes="
                        f"{nvl_bytes} kept: the NVL buffer is shared with cudaIpcGetMemHandle "
                        f"(vmmipc)")
        else:
            log("info", f"deep_ep.Buffer: use_fabric=False (asked: {asked}); num_nvl_bytes=0, "
                        f"so this buffer has no NVL part and no legacy IPC happens")
        return bound.args[1:], bound.kwargs

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        try:
            new_args, new_kwargs = rewrite(args, kwargs)
        except Exception as error:  # a bug here must not cost the job its Buffer
            log("warning", f"vmmipc.deepep: {type(error).__name__}: {error}; building the "
                           "Buffer with the arguments as given")
            new_args, new_kwargs = args, kwargs
        return original(self, *new_args, **new_kwargs)

    setattr(__init__, _MARK, True)
    return __init__


def patch_buffer_class(buffer_class):
    """Wraps buffer_class.__init__ once. Returns False if it was wrapped already."""
    original = buffer_class.__dict__.get("__init__", buffer_class.__init__)
    if getattr(original, _MARK, False):
        return False
    buffer_class.__init__ = _wrap_init(buffer_class, original)
    return True


def _patch_module(module):
    buffer_class = getattr(module, "Buffer", None)
    if not isinstance(buffer_class, type):
        log("warning", f"vmmipc.deepep: {getattr(module, '__file__', module)} has no Buffer "
                       "class; nothing was patched")
        return False
    patch_buffer_class(buffer_class)
    return True


def install():
    """Imports deep_ep now and wraps deep_ep.Buffer. Returns the Buffer class, or None
    (with a warning line) when deep_ep cannot be imported or has no Buffer class."""
    try:
        import deep_ep  # the program's DeepEP
    except ImportError as error:
        log("warning", f"vmmipc.deepep: deep_ep cannot be imported ({error}); nothing was "
                       "patched")
        return None
    if not _patch_module(deep_ep):
        return None
    return deep_ep.Buffer


class _PatchingLoader(importlib.abc.Loader):
    """Runs deep_ep's own loader, then wraps its Buffer."""

    def __init__(self, inner, hook):
        self._inner = inner
        self._hook = hook

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _remove_hook(self._hook)
        _patch_module(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ... of the real loader
        return getattr(self._inner, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Finds deep_ep with the other finders and hands back a patching loader."""

    def __init__(self):
        self._searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != "deep_ep" or self._searching:
            return None
        self._searching = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self)
        return spec


def _remove_hook(hook):
    try:
        sys.meta_path.remove(hook)
    except ValueError:
        pass


def install_import_hook():
    """Wraps deep_ep.Buffer as soon as deep_ep is imported (now, if it already is)."""
    module = sys.modules.get("deep_ep")
    if module is not None:
        return _patch_module(module)
    if not any(isinstance(finder, _ImportHook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ImportHook())
    return True


def install_from_environment(environ=None):
    """install_import_hook() when DEEPEP_VMMIPC asks for it. Returns whether it did."""
    if not enabled(environ):
        return False
    install_import_hook()
    return True
