#!/usr/bin/env python3
"""Tests of vmmipc.deepep (python/vmmipc/deepep.py) against stand-in
deep_ep modules: the real DeepEP needs torch, CUDA and NVSHMEM, none of which
this needs. A stand-in has the Buffer.__init__ signature of a DeepEP release
with use_fabric (and of releases without it: older 1.x, and 2.x's legacy
Buffer) and records what it was given. The integration never breaks a job:
where there is nothing to rewrite it logs one line and passes through.

Every case runs in a fresh Python process (imports and sys.meta_path stay
clean), with python/ and the stand-in on PYTHONPATH.
Standard library only. ctest: scripts.deepep_integration (unit).
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PYTHON_DIR = os.path.join(SOURCE_DIR, "python")

# DeepEP with use_fabric (the signature of deep_ep.Buffer in releases that have it).
STANDIN_WITH_FABRIC = '''
__version__ = "standin-with-fabric"
import os
IMPORTED_AT_START = os.environ.get("STANDIN_MARK")

class Buffer:
    num_sms = 20

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 use_fabric: bool = False, explicitly_destroy: bool = False,
                 enable_shrink: bool = False, comm=None) -> None:
        self.given = dict(group=group, num_nvl_bytes=num_nvl_bytes,
                          num_rdma_bytes=num_rdma_bytes, low_latency_mode=low_latency_mode,
                          num_qps_per_rank=num_qps_per_rank, allow_mnnvl=allow_mnnvl,
                          use_fabric=use_fabric, explicitly_destroy=explicitly_destroy)
'''

# An older DeepEP: no use_fabric (it always used cudaMalloc + cudaIpcGetMemHandle).
STANDIN_WITHOUT_FABRIC = '''
__version__ = "standin-without-fabric"

class Buffer:
    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, comm=None) -> None:
        self.given = dict(num_nvl_bytes=num_nvl_bytes, explicitly_destroy=explicitly_destroy)
'''

# DeepEP 2.x: deep_ep/buffers/legacy.py holds a Buffer without use_fabric; deep_ep re-exports it.
STANDIN_V2_LEGACY = '''
class Buffer:
    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0,
                 low_latency_mode: bool = False, num_qps_per_rank: int = 24,
                 allow_nvlink_for_low_latency_mode: bool = True, allow_mnnvl: bool = False,
                 explicitly_destroy: bool = False, enable_shrink: bool = False,
                 comm=None) -> None:
        self.given = dict(num_nvl_bytes=num_nvl_bytes, num_rdma_bytes=num_rdma_bytes)
'''

# A Buffer whose __init__ signature cannot be read (as a compiled extension's may be).
STANDIN_NO_SIGNATURE = '''
__version__ = "standin-no-signature"

class Buffer:
    def __init__(self, *args, **kwargs):
        self.given = dict(args=list(args[1:]), kwargs=kwargs)
    __init__.__signature__ = "not a signature"  # inspect.signature raises TypeError
'''


class DeepEPIntegrationTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def standin(self, source, name="standin"):
        """A deep_ep package laid out like DeepEP's: Buffer in deep_ep/buffer.py."""
        folder = os.path.join(self.tmp.name, name)
        os.makedirs(os.path.join(folder, "deep_ep"))
        with open(os.path.join(folder, "deep_ep", "buffer.py"), "w") as handle:
            handle.write(textwrap.dedent(source))
        with open(os.path.join(folder, "deep_ep", "__init__.py"), "w") as handle:
            handle.write("from .buffer import Buffer, __version__\n")
        return folder

    def python(self, code, path, extra_env=None, expect_ok=True):
        """Runs `code` in a fresh interpreter; returns (last stdout line as JSON, stderr)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("DEEPEP_VMMIPC", "PYTHONPATH", "VMMIPC_RANK", "LOCAL_RANK", "RANK")}
        env["PYTHONPATH"] = ":".join(path)
        env.update(extra_env or {})
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                                capture_output=True, text=True, timeout=60)
        if expect_ok:
            self.assertEqual(result.returncode, 0, result.stderr)
            return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr
        return result, result.stderr

    def test_install_forces_legacy_ipc_and_keeps_the_nvl_size(self):
        given, log = self.python('''
            import json, vmmipc.deepep
            Buffer = vmmipc.deepep.install()
            b = Buffer("group", 1 << 30, 0, True, 8, use_fabric=True, allow_mnnvl=True)
            print(json.dumps(b.given))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)], {"LOCAL_RANK": "3"})
        self.assertEqual(given, {"group": "group", "num_nvl_bytes": 1 << 30, "num_rdma_bytes": 0,
                                 "low_latency_mode": True, "num_qps_per_rank": 8,
                                 "allow_mnnvl": True, "use_fabric": False,
                                 "explicitly_destroy": False})
        self.assertRegex(log, r"\[vmmipc pid [0-9]+\] info: deep_ep.Buffer: "
                              r"use_fabric=False \(asked: True\), num_nvl_bytes=1073741824 kept")

    def test_positional_use_fabric_is_overridden_too(self):
        given, _ = self.python('''
            import json, vmmipc.deepep
            Buffer = vmmipc.deepep.install()
            b = Buffer(None, 4096, 0, False, 24, True, False, True, True)
            print(json.dumps(b.given))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)])
        self.assertFalse(given["use_fabric"])
        self.assertTrue(given["explicitly_destroy"])
        self.assertEqual(given["num_nvl_bytes"], 4096)

    def test_install_is_idempotent_and_keeps_the_signature(self):
        result, _ = self.python('''
            import inspect, json, vmmipc.deepep
            Buffer = vmmipc.deepep.install()
            first = Buffer.__init__
            vmmipc.deepep.install()
            vmmipc.deepep.install_import_hook()
            print(json.dumps({"same": Buffer.__init__ is first,
                              "params": list(inspect.signature(Buffer.__init__).parameters)}))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)])
        self.assertTrue(result["same"])
        self.assertIn("use_fabric", result["params"])
        self.assertIn("num_nvl_bytes", result["params"])

    def test_a_subclass_is_covered_through_super(self):
        given, _ = self.python('''
            import json, vmmipc.deepep
            Buffer = vmmipc.deepep.install()
            class FrameworkBuffer(Buffer):
                def __init__(self, group, size):
                    super().__init__(group, num_nvl_bytes=size, use_fabric=True)
            print(json.dumps(FrameworkBuffer(None, 2048).given))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)])
        self.assertFalse(given["use_fabric"])
        self.assertEqual(given["num_nvl_bytes"], 2048)

    def test_a_buffer_without_nvl_part_says_so(self):
        _, log = self.python('''
            import json, vmmipc.deepep
            b = vmmipc.deepep.install()(None, 0, 1 << 20, True, use_fabric=True)
            print(json.dumps(b.given))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)])
        self.assertIn("num_nvl_bytes=0, so this buffer has no NVL part", log)

    def test_use_fabric_false_already_passes_through_with_one_line(self):
        given, log = self.python('''
            import json, vmmipc.deepep
            Buffer = vmmipc.deepep.install()
            first = Buffer("group", 1 << 20).given          # DeepEP's default: False
            second = Buffer("group", 2048, use_fabric=False).given
            print(json.dumps([first, second]))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)], {"LOCAL_RANK": "1"})
        self.assertEqual([g["use_fabric"] for g in given], [False, False])
        self.assertEqual([g["num_nvl_bytes"] for g in given], [1 << 20, 2048])
        lines = log.strip().splitlines()
        self.assertEqual(len(lines), 1, log)
        self.assertRegex(lines[0], r"\[vmmipc pid [0-9]+\] info: deep_ep.Buffer: "
                                   r"use_fabric is False already; vmmipc.deepep passes every "
                                   r"argument through unchanged \(deep_ep standin-with-fabric")

    def test_deepep_without_use_fabric_passes_through_with_one_line(self):
        given, log = self.python('''
            import json, vmmipc.deepep
            Buffer = vmmipc.deepep.install()   # never raises
            given = [Buffer(None, 1 << 20).given, Buffer(None, 64, explicitly_destroy=True).given]
            print(json.dumps(given))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITHOUT_FABRIC)])
        self.assertEqual(given, [{"num_nvl_bytes": 1 << 20, "explicitly_destroy": False},
                                 {"num_nvl_bytes": 64, "explicitly_destroy": True}])
        lines = log.strip().splitlines()
        self.assertEqual(len(lines), 1, log)
        self.assertIn("has no use_fabric parameter", lines[0])
        self.assertIn("passes every argument through unchanged", lines[0])
        self.assertIn("standin-without-fabric", lines[0])

    def test_deepep_2_legacy_buffer_through_the_environment_hook(self):
        folder = os.path.join(self.tmp.name, "v2")
        os.makedirs(os.path.join(folder, "deep_ep", "buffers"))
        with open(os.path.join(folder, "deep_ep", "buffers", "legacy.py"), "w") as handle:
            handle.write(textwrap.dedent(STANDIN_V2_LEGACY))
        with open(os.path.join(folder, "deep_ep", "buffers", "__init__.py"), "w") as handle:
            handle.write("")
        with open(os.path.join(folder, "deep_ep", "__init__.py"), "w") as handle:
            handle.write("from .buffers.legacy import Buffer\n__version__ = '2.1.0'\n")
        given, log = self.python('''
            import json, deep_ep
            print(json.dumps(deep_ep.Buffer(None, 1 << 30, 0).given))
        ''', [PYTHON_DIR, folder], {"DEEPEP_VMMIPC": "1"})
        self.assertEqual(given, {"num_nvl_bytes": 1 << 30, "num_rdma_bytes": 0})
        self.assertIn("deep_ep 2.1.0", log)
        self.assertIn("has no use_fabric parameter", log)

    def test_unreadable_signature_passes_through(self):
        given, log = self.python('''
            import json, vmmipc.deepep
            print(json.dumps(vmmipc.deepep.install()(None, 4096, use_fabric=True).given))
        ''', [PYTHON_DIR, self.standin(STANDIN_NO_SIGNATURE)])
        self.assertEqual(given, {"args": [4096], "kwargs": {"use_fabric": True}})
        self.assertIn("has no readable signature", log)

    def test_arguments_deepep_rejects_get_deepeps_own_error(self):
        result, log = self.python('''
            import json, vmmipc.deepep
            Buffer = vmmipc.deepep.install()
            try:
                Buffer(None, 64, no_such_argument=1)
            except TypeError as error:
                print(json.dumps({"error": str(error)}))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)])
        self.assertIn("no_such_argument", result["error"])
        self.assertEqual(log, "")

    def test_install_without_deep_ep_or_buffer_returns_none(self):
        empty = os.path.join(self.tmp.name, "empty")
        os.makedirs(os.path.join(empty, "deep_ep"))
        with open(os.path.join(empty, "deep_ep", "__init__.py"), "w") as handle:
            handle.write("")
        for path, expected in (([PYTHON_DIR], "cannot be imported"),
                               ([PYTHON_DIR, empty], "has no Buffer class")):
            result, log = self.python('''
                import json, vmmipc.deepep
                print(json.dumps({"installed": vmmipc.deepep.install()}))
            ''', path)
            self.assertEqual(result, {"installed": None})
            self.assertIn(expected, log)

    def test_environment_hook_patches_deep_ep_when_it_is_imported(self):
        given, _ = self.python('''
            import json, sys
            before = "deep_ep" in sys.modules
            import deep_ep
            b = deep_ep.Buffer(None, 1 << 20, use_fabric=True)
            print(json.dumps(dict(b.given, imported_at_start=before,
                                  hooks=[type(f).__name__ for f in sys.meta_path])))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)], {"DEEPEP_VMMIPC": "1"})
        self.assertFalse(given["imported_at_start"], "deep_ep must not be imported at start-up")
        self.assertFalse(given["use_fabric"])
        self.assertEqual(given["num_nvl_bytes"], 1 << 20)
        self.assertNotIn("_ImportHook", given["hooks"], "the hook removes itself once used")

    def test_environment_hook_is_off_without_the_variable(self):
        given, log = self.python('''
            import json, deep_ep
            print(json.dumps(deep_ep.Buffer(None, 1 << 20, use_fabric=True).given))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)], {"DEEPEP_VMMIPC": "0"})
        self.assertTrue(given["use_fabric"])
        self.assertEqual(log, "")

    def test_an_already_imported_deep_ep_is_patched_at_once(self):
        given, _ = self.python('''
            import json, deep_ep, vmmipc.deepep
            vmmipc.deepep.install_import_hook()
            print(json.dumps(deep_ep.Buffer(None, 64, use_fabric=True).given))
        ''', [PYTHON_DIR, self.standin(STANDIN_WITH_FABRIC)])
        self.assertFalse(given["use_fabric"])

    def test_the_shadowed_sitecustomize_still_runs(self):
        other = os.path.join(self.tmp.name, "other_site")
        os.makedirs(other)
        with open(os.path.join(other, "sitecustomize.py"), "w") as handle:
            handle.write("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
        result, _ = self.python('''
            import json, os, deep_ep
            print(json.dumps({"other": os.environ.get("OTHER_SITECUSTOMIZE"),
                              "use_fabric": deep_ep.Buffer(None, 64, use_fabric=True)
                                            .given["use_fabric"]}))
        ''', [PYTHON_DIR, other, self.standin(STANDIN_WITH_FABRIC)], {"DEEPEP_VMMIPC": "1"})
        self.assertEqual(result, {"other": "ran", "use_fabric": False})

    def test_no_deep_ep_installed_is_harmless_for_the_hook(self):
        result, _ = self.python('''
            import json
            try:
                import deep_ep
                found = True
            except ImportError:
                found = False
            print(json.dumps({"found": found}))
        ''', [PYTHON_DIR], {"DEEPEP_VMMIPC": "1"})
        self.assertEqual(result, {"found": False})


if __name__ == "__main__":
    unittest.main(verbosity=2)
