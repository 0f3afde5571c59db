#!/usr/bin/env python3
"""Tests of tests/python/memory_saver_check.py without a GPU: its helpers (patterns, the
VMMIPC_STATS follow counters, the children's environments, the torch_memory_saver wheel),
its skips (exit 77 with a SKIP line and the SUMMARY line) and, with --sim-dir where
cuda.bindings is installed, a run of the raw part on the simulated driver: the plumbing (setup,
open, control measurement, close, clean exits, the baseline's no_crash) and a child that dies.
The follow checks themselves need the GPU run (scripts/gpu-check.sh, step saver).

  test_memory_saver_check.py --lib build/csrc/libvmmipc.so [--sim-dir build/sim] [unittest args]

Standard library only. ctest: scripts.memory_saver_check (unit), scripts.memory_saver_check_sim
(sim).
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import types
import unittest
import zipfile

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HARNESS = os.path.join(SOURCE_DIR, "tests", "python", "memory_saver_check.py")
OPTIONS = argparse.Namespace(lib=None, sim_dir=None)

sys.path.insert(0, os.path.dirname(HARNESS))
import memory_saver_check as msc  # noqa: E402  (standard library at import time)

# A cuda.bindings stand-in whose cuInit finds no device (shadows a real one on PYTHONPATH).
STUB_DRIVER = '''import enum
class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NO_DEVICE = 100
class CUipcMem_flags(enum.IntEnum):
    CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
def cuInit(flags):
    return (CUresult.CUDA_ERROR_NO_DEVICE,)
'''


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VMMIPC_", "SIMCUDA_", "MEMORY_SAVER_"))
           and k not in ("LD_PRELOAD", "LOCAL_RANK", "RANK")}
    env.update(extra)
    return env


def run(args, env, timeout=300):
    return subprocess.run([sys.executable, HARNESS] + args, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def checks_of(stdout):
    """{name: status} of the CHECK lines."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "CHECK":
            out[parts[1]] = parts[2]
    return out


class HelpersTest(unittest.TestCase):

    def test_reads_name_the_pattern_they_hold(self):
        start = msc.interior_offset(64 << 20)
        data = msc.pattern(2, start, 10000)
        self.assertEqual(msc.which_seed(data, start, [1, 2]), 2)
        self.assertEqual(msc.read_report(data, start, 2, [1, 2])["ok"], True)
        self.assertEqual(msc.read_report(data, start, 3, [1, 2])["detail"], "pattern 2, not 3")
        shifted = msc.read_report(msc.pattern(2, 0, 10000), start, 2, [1, 2])
        self.assertFalse(shifted["ok"])
        self.assertIn("first difference at byte offset", shifted["detail"])

    def test_follow_counters_of_the_stats_report(self):
        text = ("[vmmipc pid 1 rank 1] info: vmmipc 0.1.0 stats at exit:\n"
                "[vmmipc pid 1 rank 1] info:   import: handles_opened=2 follow_pauses=32 "
                "follow_resumes=32 follow_resume_refused=0\n")
        self.assertEqual(msc.follow_stats(text), (
            {"follow_pauses": 32, "follow_resumes": 32, "follow_resume_refused": 0}, True))
        self.assertEqual(msc.follow_stats("no report"), ({}, False))

    def test_children_environments(self):
        saved = dict(os.environ)
        try:
            os.environ["LD_PRELOAD"] = "/x/torch_memory_saver_hook_mode_preload_cu13.abi3.so " \
                                       "/b/libvmmipc.so"
            os.environ["LOCAL_RANK"] = "3"
            os.environ.pop("VMMIPC_STATS", None)
            env = msc.base_env()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        self.assertEqual(env["LD_PRELOAD"], "/b/libvmmipc.so")
        self.assertEqual(env["VMMIPC_STATS"], "1")
        self.assertNotIn("LOCAL_RANK", env)
        # Follow is the default: its runs set nothing (a 0 in the environment goes); the
        # baseline sets it off.
        follow = msc.with_follow(dict(env, VMMIPC_FOLLOW="0"), True, 1)
        self.assertNotIn("VMMIPC_FOLLOW", follow)
        self.assertEqual(follow["VMMIPC_RANK"], "1")
        baseline = msc.with_follow(follow, False, 0)
        self.assertEqual((baseline["VMMIPC_FOLLOW"], baseline["VMMIPC_RANK"]), ("0", "0"))

    def test_wheel_found_and_unzipped_without_pip(self):
        with tempfile.TemporaryDirectory() as folder:
            wheel = os.path.join(folder, "torch_memory_saver-0.0.10-cp39-abi3-any.whl")
            with zipfile.ZipFile(wheel, "w") as archive:
                archive.writestr("torch_memory_saver/__init__.py", "")
                archive.writestr("torch_memory_saver_hook_mode_preload_cu13.abi3.so", "")
            self.assertEqual(msc.find_wheel(types.SimpleNamespace(wheel=wheel)), wheel)
            self.assertIsNone(msc.find_wheel(types.SimpleNamespace(
                wheel=os.path.join(folder, "missing.whl"))))
            real = msc.subprocess.run
            msc.subprocess.run = lambda *a, **k: types.SimpleNamespace(
                returncode=1, stdout="", stderr="No module named pip\n")
            try:
                how = msc.install_wheel(wheel, os.path.join(folder, "site"))
            finally:
                msc.subprocess.run = real
            self.assertEqual(how, "unzipped (pip failed: No module named pip)")
            self.assertTrue(os.path.isfile(os.path.join(
                folder, "site", "torch_memory_saver_hook_mode_preload_cu13.abi3.so")))


class SkipTest(unittest.TestCase):
    """Nothing to run on: exit 77, one SKIP line, the SUMMARY line."""

    def assert_skipped(self, result, why):
        self.assertEqual(result.returncode, 77, result.stdout + result.stderr)
        self.assertIn(f"SKIP: {why}", result.stdout)
        self.assertIn("SUMMARY memory_saver_check: 0 PASS, 0 FAIL, 1 SKIP", result.stdout)
        self.assertNotIn("Traceback", result.stderr)

    def test_without_the_preload(self):
        with tempfile.TemporaryDirectory() as folder:
            os.makedirs(os.path.join(folder, "cuda", "bindings"))
            for name, text in (("__init__.py", ""), ("bindings/__init__.py", ""),
                               ("bindings/driver.py", STUB_DRIVER)):
                with open(os.path.join(folder, "cuda", name), "w") as out:
                    out.write(text)
            self.assert_skipped(run([], clean_env(PYTHONPATH=folder)),
                                "libvmmipc.so is not in LD_PRELOAD")
            if OPTIONS.lib:
                self.assert_skipped(run([], clean_env(PYTHONPATH=folder, LD_PRELOAD=OPTIONS.lib)),
                                    "no CUDA device: cuInit: CUDA_ERROR_NO_DEVICE(100)")

    def test_without_cuda_bindings(self):
        with tempfile.TemporaryDirectory() as folder:
            os.makedirs(os.path.join(folder, "cuda"))
            with open(os.path.join(folder, "cuda", "__init__.py"), "w") as out:
                out.write("raise ImportError('no cuda.bindings in this test')\n")
            result = run([], clean_env(PYTHONPATH=folder, LD_PRELOAD=OPTIONS.lib or "libvmmipc.so"))
            self.assert_skipped(result, "cuda.bindings is not installed")


class SimRunTest(unittest.TestCase):
    """The raw part on the simulated driver (host memory, no graphs, free memory per process)."""

    def setUp(self):
        if not (OPTIONS.sim_dir and OPTIONS.lib):
            self.skipTest("needs --sim-dir and --lib")
        if importlib.util.find_spec("cuda") is None or \
                importlib.util.find_spec("cuda.bindings") is None:
            self.skipTest("cuda.bindings is not installed")

    def run_sim(self, **extra):
        env = clean_env(LD_PRELOAD=OPTIONS.lib, LD_LIBRARY_PATH=OPTIONS.sim_dir,
                        SIMCUDA_DEVICE_COUNT="1", **extra)
        return run(["--parts", "raw", "--layouts", "2m", "--timeout-s", "20"], env)

    def test_plumbing(self):
        result = self.run_sim()
        checks = checks_of(result.stdout)
        for name in ("raw-2m.exporter_setup", "raw-2m.control_pause_frees_without_importer",
                     "raw-2m.import_reads_pattern", "raw-2m.resume", "raw-2m.close",
                     "raw-2m.processes_exit_cleanly", "baseline.raw-2m.no_crash"):
            self.assertEqual(checks.get(name), "PASS", f"{name}: {result.stdout}")
        # The simulator has no streams or graphs: the graph check runs (and fails there).
        self.assertIn("raw-2m.graph_replay_before_pause", checks)
        self.assertIn("INFO baseline.raw-2m.importer_reads_new_bytes", result.stdout)
        self.assertRegex(result.stdout, r"SUMMARY memory_saver_check: \d+ PASS, \d+ FAIL, 0 SKIP")
        self.assertNotIn("Traceback", result.stderr)

    def test_a_child_that_dies(self):
        result = self.run_sim(MEMORY_SAVER_CHECK_BREAK="importer:check")
        checks = checks_of(result.stdout)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(checks.get("raw-2m.children_answer"), "FAIL")
        self.assertIn("importer ended during check: exit 3", result.stdout)
        self.assertEqual(checks.get("baseline.raw-2m.no_crash"), "FAIL")
        self.assertNotIn("Traceback", result.stderr)


def main():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--lib")
    parser.add_argument("--sim-dir")
    known, rest = parser.parse_known_args()
    OPTIONS.lib, OPTIONS.sim_dir = known.lib, known.sim_dir
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
