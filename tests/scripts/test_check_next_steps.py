#!/usr/bin/env python3
"""`vmmipc-run --check` without a GPU says what to do next, and the wheel's simulated
driver is loaded only when asked for (`python -m vmmipc demo`):

- without a driver: how to point vmmipc at one (a libcuda.so.1 found off the loader's
  path is named), and the demo command of the installation (the source tree's
  scripts/demo.sh, the wheel's `python -m vmmipc demo`);
- without a GPU (the simulated driver with no device): the demo;
- a wheel layout with vmmipc/_sim: --check does not load that simulator, and `python -m
  vmmipc demo` runs on it (with --sim-dir and the build's vmmipc_peer).

  test_check_next_steps.py --lib build/csrc/libvmmipc.so [--sim-dir build/sim]
                           [--peer build/tests/e2e/vmmipc_peer] [unittest args]

Standard library only. ctest: scripts.check_next_steps (unit) and
scripts.check_next_steps_sim (sim).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SOURCE_DIR, "scripts", "vmmipc-run")
PYTHON_DIR = os.path.join(SOURCE_DIR, "python")
OPTIONS = argparse.Namespace(lib=None, sim_dir=None, peer=None)
NO_DRIVER = "libcuda-that-does-not-exist.so.1"

sys.path.insert(0, PYTHON_DIR)
from vmmipc import check, check_driver  # noqa: E402  (from this source tree)


def clean_env(**extra):
    """The test's environment without VMMIPC_*, rank, preload and simulator variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VMMIPC_") and k not in ("LOCAL_RANK", "RANK", "LD_PRELOAD",
                                                        "LD_LIBRARY_PATH",
                                                        "SIMCUDA_DEVICE_COUNT")}
    if OPTIONS.lib:
        env["BUILD_DIR"] = os.path.dirname(os.path.dirname(os.path.abspath(OPTIONS.lib)))
    env.update(extra)
    return env


def next_lines(out):
    return [line for line in out.splitlines() if line.startswith("[next]")]


def wheel_layout(site, sim_dir=None, peer=None):
    """A wheel's vmmipc package under `site`: the Python files, the library and
    vmmipc-config, and with sim_dir the simulated driver and the peer in vmmipc/_sim."""
    package = os.path.join(site, "vmmipc")
    shutil.copytree(os.path.join(PYTHON_DIR, "vmmipc"), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    lib = os.path.abspath(OPTIONS.lib)
    shutil.copy(lib, os.path.join(package, "libvmmipc.so"))
    shutil.copy(os.path.join(os.path.dirname(lib), "vmmipc-config"), package)
    if sim_dir:
        os.mkdir(os.path.join(package, "_sim"))
        shutil.copy(os.path.join(sim_dir, "libcuda.so.1"), os.path.join(package, "_sim"))
        shutil.copy(peer, os.path.join(package, "_sim", "vmmipc_peer"))
    return os.path.realpath(package)


class NextStepsTest(unittest.TestCase):
    """The lines in-process, with made-up driver folders."""

    class Report(check.Report):
        def __init__(self):
            super().__init__()
            self.lines = []

        def line(self, status, topic, text, reason=None):
            self.lines.append((status, topic, text))

    def test_a_driver_off_the_search_path_is_named(self):
        with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as folder:
            open(os.path.join(folder, "libcuda.so.1"), "w").close()
            report = self.Report()
            check.next_steps(report, check_driver.NO_DRIVER, "libcuda.so.1", (empty, folder))
            status, topic, text = report.lines[0]
            self.assertEqual((status, topic), ("next", "driver"))
            path = os.path.join(folder, "libcuda.so.1")
            self.assertIn(f"{path} exists but was not loaded: LD_LIBRARY_PATH={folder} "
                          f"vmmipc-run --check, or VMMIPC_CUDA_LIBRARY={path}", text)
            self.assertEqual(report.lines[1][:2], ("next", "try it"))
            self.assertEqual(report.failures, [])  # next steps are no reasons of the verdict

    def test_without_a_driver_anywhere_it_says_how_to_name_one(self):
        with tempfile.TemporaryDirectory() as empty:
            report = self.Report()
            check.next_steps(report, check_driver.NO_DRIVER, "libcuda.so.1", (empty,))
            text = report.lines[0][2]
            self.assertIn("LD_LIBRARY_PATH=/path/to/driver/lib vmmipc-run --check", text)
            self.assertIn("VMMIPC_CUDA_LIBRARY=/path/to/libcuda.so.1", text)
            self.assertIn("--gpus all", text)

    def test_without_a_gpu_only_the_demo_is_offered(self):
        report = self.Report()
        check.next_steps(report, check_driver.NO_GPU, "libcuda.so.1", ())
        self.assertEqual([topic for _, topic, _ in report.lines], ["try it"])
        # From this source tree: its demo script.
        self.assertIn(os.path.join(SOURCE_DIR, "scripts", "demo.sh"), report.lines[0][2])


class CheckWithoutDriverTest(unittest.TestCase):
    """The whole --check where libcuda cannot be loaded."""

    def setUp(self):
        if not OPTIONS.lib:
            self.skipTest("needs --lib")

    def test_the_source_tree_offers_its_demo_script(self):
        result = subprocess.run(
            [sys.executable, SCRIPT, "--lib", OPTIONS.lib, "--check"],
            env=clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER), capture_output=True, text=True,
            timeout=120)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        lines = next_lines(result.stdout)
        self.assertEqual(len(lines), 2, result.stdout)
        self.assertRegex(lines[0], r"^\[next\] driver +on a GPU machine, name the driver's "
                         r"folder \(LD_LIBRARY_PATH=")
        self.assertEqual(lines[1], "[next] try it          without a GPU, on vmmipc's "
                         "simulated driver: " + os.path.join(SOURCE_DIR, "scripts", "demo.sh"))
        # Still the last line: the verdict, and the same one.
        self.assertRegex(result.stdout.splitlines()[-1],
                         r"^VERDICT: FAIL: cannot share memory here: no CUDA driver")

    def test_a_wheel_without_its_simulator_points_to_the_wheel_and_the_source(self):
        with tempfile.TemporaryDirectory() as site:
            wheel_layout(site)
            result = subprocess.run(
                [sys.executable, "-c", "import sys; from vmmipc import run; run.entry(sys.argv[1:])",
                 "--check"], env=clean_env(PYTHONPATH=site, VMMIPC_CUDA_LIBRARY=NO_DRIVER,
                                           BUILD_DIR="/nonexistent"),
                capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
            self.assertIn("python -m vmmipc demo) or a source tree (scripts/demo.sh)",
                          next_lines(result.stdout)[-1])


class SimulatedDriverTest(unittest.TestCase):
    """The wheel's simulator (ctest label sim: needs --sim-dir and --peer)."""

    def setUp(self):
        if not (OPTIONS.lib and OPTIONS.sim_dir and OPTIONS.peer):
            self.skipTest("needs --lib, --sim-dir and --peer")

    def python(self, site, args, **env):
        return subprocess.run([sys.executable] + args,
                              env=clean_env(PYTHONPATH=site, BUILD_DIR="/nonexistent", **env),
                              capture_output=True, text=True, timeout=120)

    def test_no_device_offers_the_demo(self):
        result = subprocess.run(
            [sys.executable, SCRIPT, "--lib", OPTIONS.lib, "--check"],
            env=clean_env(LD_LIBRARY_PATH=OPTIONS.sim_dir, SIMCUDA_DEVICE_COUNT="0"),
            capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("cuInit failed: CUDA_ERROR_NO_DEVICE", result.stdout)
        self.assertEqual([line.split()[1] for line in next_lines(result.stdout)], ["try"])

    def test_the_wheels_simulator_is_loaded_only_by_the_demo(self):
        with tempfile.TemporaryDirectory() as site:
            package = wheel_layout(site, OPTIONS.sim_dir, OPTIONS.peer)
            check_script = "import sys; from vmmipc import run; run.entry(sys.argv[1:])"
            result = self.python(site, ["-c", check_script, "--check"])
            # The system's driver or none, never the package's simulator.
            self.assertNotIn("SIMULATED", result.stdout)
            self.assertNotIn(os.path.join(package, "_sim"), result.stdout)
            if result.returncode == 1 and "cannot be loaded" in result.stdout:
                self.assertIn(f"{sys.executable} -m vmmipc demo", next_lines(result.stdout)[-1])
            # A program run with the preload finds the system's libcuda.so.1 or none, not the
            # package's (no RUNPATH into the package).
            loads = ("import ctypes, sys\n"
                     "try:\n    ctypes.CDLL('libcuda.so.1')\n"
                     "except OSError:\n    sys.exit(0)\n"
                     "print(open('/proc/self/maps').read())")
            result = self.python(site, ["-c", check_script, "--", sys.executable, "-c", loads])
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertNotIn(os.path.join(package, "_sim"), result.stdout)
            # The demo, on the package's simulator (--simulated: also on a GPU machine).
            result = self.python(site, ["-m", "vmmipc", "demo", "--simulated"])
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertIn("vmmipc demo on the simulated CUDA driver", result.stdout)
            self.assertIn(f"library: {os.path.join(package, 'libvmmipc.so')}", result.stdout)
            # First the driver's own answer without vmmipc, which the simulator reproduces.
            self.assertRegex(result.stdout, r"without vmmipc \(pid \d+, no LD_PRELOAD\): "
                             r"cuMemCreate \+ cuMemMap at 0x[0-9a-f]+, cuIpcGetMemHandle -> "
                             r"CUDA_ERROR_INVALID_VALUE \(1\): the driver refuses VMM memory "
                             r"for legacy IPC\n")
            self.assertIn("cuIpcOpenMemHandle -> 0x300000000000", result.stdout)
            # The zone as vmmipc-config settles it (the package's tool), not spelled out.
            self.assertIn("= import zone 0x300000000000 + slot 0 x 1 TiB + (address - region "
                          "base)", result.stdout)
            self.assertIn("same address as the first run", result.stdout)
            result = self.python(site, ["-m", "vmmipc", "--lib", "--simulated"])
            self.assertEqual(result.returncode, 2)
            self.assertIn("--simulated goes with --demo", result.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--lib")
    parser.add_argument("--sim-dir")
    parser.add_argument("--peer")
    OPTIONS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
