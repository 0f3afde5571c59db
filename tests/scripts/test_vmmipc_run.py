#!/usr/bin/env python3
"""Tests of the launcher (the module vmmipc.run, python/vmmipc/run.py, run through
its wrapper scripts/vmmipc-run): its table of variables against params.def, its parsers
against the library's, LD_PRELOAD handling, the run mode's environment, where it finds the
library (install tree, wheel), `python -m vmmipc`, and --check without a driver and (with
--sim-dir) on the simulated driver.

  test_vmmipc_run.py --lib build/csrc/libvmmipc.so [--sim-dir build/sim] [unittest args]

Standard library only. ctest: scripts.vmmipc_run (unit) and scripts.vmmipc_run_check_sim (sim).
"""

import argparse
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SOURCE_DIR, "scripts", "vmmipc-run")
PYTHON_DIR = os.path.join(SOURCE_DIR, "python")
MODULE = os.path.join(PYTHON_DIR, "vmmipc", "run.py")
OPTIONS = argparse.Namespace(lib=None, sim_dir=None)
NO_DRIVER = "libcuda-that-does-not-exist.so.1"


def load_script():
    loader = importlib.machinery.SourceFileLoader("vmmipc_run", MODULE)
    spec = importlib.util.spec_from_loader("vmmipc_run", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


run_module = load_script()


def clean_env(**extra):
    """The test's environment without any VMMIPC_*/rank variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VMMIPC_") and k not in ("LOCAL_RANK", "RANK", "LD_PRELOAD",
                                                        "DEEPEP_VMMIPC", "SIMCUDA_DEVICE_COUNT")}
    env.update(extra)
    return env


def run(args, env, **kwargs):
    return subprocess.run([sys.executable, SCRIPT] + args, env=env, capture_output=True,
                          text=True, timeout=120, **kwargs)


class ConfigTableTest(unittest.TestCase):
    """The script's copy of the library's table and parsers."""

    def test_table_matches_params_def(self):
        with open(os.path.join(SOURCE_DIR, "csrc", "config", "params.def")) as handle:
            text = handle.read()
        kinds = {"kBool": "bool", "kInt": "int", "kSize": "size", "kString": "string",
                 "kLogLevel": "level"}
        declared = [(name, kinds[kind], default) for name, kind, default in re.findall(
            r'VMMIPC_PARAM\(\s*\w+,\s*"(\w+)",\s*(k\w+),\s*"([^"]*)"', text)]
        self.assertTrue(declared)
        self.assertEqual(run_module.PARAMS, declared,
                         "scripts/vmmipc-run's PARAMS differs from csrc/config/params.def")

    def test_version_matches_the_project(self):
        with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as handle:
            version = re.search(r"project\(vmmipc VERSION ([0-9.]+)", handle.read()).group(1)
        self.assertEqual(run_module.VERSION, version)
        with open(os.path.join(SOURCE_DIR, "pyproject.toml")) as handle:
            self.assertEqual(re.search(r'^version = "([0-9.]+)"', handle.read(), re.M).group(1),
                             version)
        sys.path.insert(0, PYTHON_DIR)
        try:
            import vmmipc
        finally:
            sys.path.pop(0)
        self.assertEqual(vmmipc.__version__, version)

    def test_size_parser_accepts_what_the_library_accepts(self):
        parse = run_module._parse_size
        self.assertEqual(parse("1T"), 1 << 40)
        self.assertEqual(parse("512GiB"), 512 << 30)
        self.assertEqual(parse(" 64m "), 64 << 20)
        self.assertEqual(parse("0x10"), 16)
        self.assertEqual(parse("0x300000000000"), 0x300000000000)
        self.assertEqual(parse("010"), 10)  # decimal: a leading zero is not octal
        self.assertEqual(parse("08"), 8)
        self.assertEqual(parse("010T"), 10 << 40)
        for bad in ("", "-1", "+1", "12Q", "1TT", "0xZZ", "99999999999999999999", "20000000T",
                    "0x", "0x0x10"):
            with self.assertRaises(ValueError, msg=bad):
                parse(bad)

    def test_bool_int_and_level_parsers(self):
        self.assertTrue(run_module._parse_bool(" Yes "))
        self.assertFalse(run_module._parse_bool("off"))
        self.assertRaises(ValueError, run_module._parse_bool, "maybe")
        self.assertEqual(run_module._parse_int(" 5 "), 5)
        self.assertRaises(ValueError, run_module._parse_int, "seven")
        self.assertEqual(run_module._parse_level("WARNING"), "warn")
        self.assertEqual(run_module._parse_level("none"), "off")
        self.assertRaises(ValueError, run_module._parse_level, "loud")

    def test_bad_values_warn_and_keep_the_default(self):
        config = run_module.Config({"VMMIPC_TIMEOUT_MS": "0", "VMMIPC_ZONE_BASE": "0x300000000001",
                                    "VMMIPC_SLOT_SIZE": "512G", "VMMIPC_LOGLEVEL": "info"})
        self.assertEqual(config["VMMIPC_TIMEOUT_MS"], 5000)
        self.assertEqual(config["VMMIPC_ZONE_BASE"], 0x300000000000)
        self.assertEqual(config["VMMIPC_SLOT_SIZE"], 512 << 30)
        text = "\n".join(config.warnings)
        self.assertIn("VMMIPC_TIMEOUT_MS='0' is ignored: must be between 1 and 3600000", text)
        self.assertIn("VMMIPC_ZONE_BASE='0x300000000001' is ignored: must be a multiple", text)
        self.assertIn("VMMIPC_LOGLEVEL is not a vmmipc variable", text)

    def test_layout_is_settled_like_the_library(self):
        # params_test.cc's ParamsLayout cases: the same values, the same outcome.
        config = run_module.Config({"VMMIPC_ZONE_SLOTS": "2",
                                    "VMMIPC_SLOT_SIZE": "0x8000000002000000"})
        self.assertEqual((config["VMMIPC_ZONE_SLOTS"], config["VMMIPC_SLOT_SIZE"]), (8, 1 << 40))
        self.assertIn("the import zone (slots x slot size) overflows 64 bits",
                      "\n".join(config.warnings))
        config = run_module.Config({"VMMIPC_ZONE_BASE": "0x7f0000000000",
                                    "VMMIPC_ZONE_FALLBACK_BASE": "0x340000000000",
                                    "VMMIPC_ARENA_SIZE": "2T"})
        self.assertEqual(config["VMMIPC_ZONE_BASE"], 0x300000000000)
        self.assertEqual(config["VMMIPC_ZONE_FALLBACK_BASE"], 0x600000000000)
        self.assertEqual(config["VMMIPC_ARENA_SIZE"], 1 << 40)
        text = "\n".join(config.warnings)
        self.assertIn("VMMIPC_ZONE_BASE=0x7f0000000000 is ignored: the import zone "
                      "[0x7f0000000000, +8 TiB) ends past 0x800000000000", text)
        self.assertIn("overlaps the import zone [0x300000000000, +8 TiB); the default "
                      "0x600000000000 is used", text)
        config = run_module.Config({"VMMIPC_ZONE_SLOTS": "100",
                                    "VMMIPC_ZONE_BASE": "0x100000000000"})
        self.assertEqual(config["VMMIPC_ZONE_BASE"], 0x100000000000)
        self.assertEqual(config["VMMIPC_ZONE_FALLBACK_BASE"], 0)
        self.assertFalse(config["VMMIPC_ARENA"])
        self.assertEqual(config.layout_off, {"fallback", "arena"})
        config = run_module.Config({"VMMIPC_SLOT_SIZE": "512G"})
        self.assertFalse(config["VMMIPC_ARENA"])
        self.assertEqual(run_module.Config({"VMMIPC_ZONE_BASE": "0x1000000000",
                                            "VMMIPC_SLOT_SIZE": "0x400000000",
                                            "VMMIPC_ZONE_FALLBACK_BASE": "0x4000000000",
                                            "VMMIPC_ARENA_BASE": "0x6800000000",
                                            "VMMIPC_ARENA_SIZE": "0x400000000"}).warnings, [])

    def test_rank_falls_back_like_the_library(self):
        def rank(env):
            config = run_module.Config(env)
            return config.rank, config.rank_source

        self.assertEqual(rank({}), (-1, "none"))
        self.assertEqual(rank({"LOCAL_RANK": "2", "RANK": "9"}), (2, "LOCAL_RANK"))
        self.assertEqual(rank({"RANK": "9"}), (9, "RANK"))
        self.assertEqual(rank({"VMMIPC_RANK": "1", "LOCAL_RANK": "2"}), (1, "VMMIPC_RANK"))
        self.assertEqual(rank({"VMMIPC_RANK": "-1", "LOCAL_RANK": "2"}), (2, "LOCAL_RANK"))
        self.assertEqual(rank({"LOCAL_RANK": "x", "RANK": "4"}), (4, "RANK"))
        self.assertEqual(rank({"LOCAL_RANK": "70000"}), (-1, "none"))
        # VMMIPC_RANK_FROM gpu and off ignore the variables; env keeps them.
        self.assertEqual(rank({"VMMIPC_RANK_FROM": "gpu", "VMMIPC_RANK": "1"}), (-1, "none"))
        self.assertEqual(rank({"VMMIPC_RANK_FROM": "off", "LOCAL_RANK": "2"}), (-1, "none"))
        self.assertEqual(rank({"VMMIPC_RANK_FROM": "env", "LOCAL_RANK": "2"}), (2, "LOCAL_RANK"))
        config = run_module.Config({"VMMIPC_RANK_FROM": "sometimes"})
        self.assertEqual(config["VMMIPC_RANK_FROM"], "auto")
        self.assertIn("must be auto, env, gpu or off", " ".join(config.warnings))

    def test_pci_addresses_parse_like_the_library(self):
        self.assertEqual(run_module.parse_pci("0000:18:00.0"), (0, 0x18, 0, 0))
        self.assertEqual(run_module.parse_pci("00000000:9A:1f.7"), (0, 0x9A, 0x1F, 7))
        for bad in ("", "bind", "0000:18:00", "0000:18:20.0", "0000:18:00.8", "000:18:00.0"):
            self.assertIsNone(run_module.parse_pci(bad), bad)


class LauncherTest(unittest.TestCase):
    """Run mode: LD_PRELOAD, the variables, exec."""

    def setUp(self):
        if not OPTIONS.lib:
            self.skipTest("needs --lib")
        self.lib = os.path.abspath(OPTIONS.lib)

    def test_preload_is_prepended_once_and_others_are_kept(self):
        prepend = run_module.prepend_preload
        self.assertEqual(prepend(None, "/a/libvmmipc.so"), "/a/libvmmipc.so")
        self.assertEqual(prepend("/x/libfoo.so /a/libvmmipc.so:/y/libbar.so", "/a/libvmmipc.so"),
                         "/a/libvmmipc.so:/x/libfoo.so:/y/libbar.so")
        self.assertEqual(prepend("/old/libvmmipc.so", "/a/libvmmipc.so"), "/a/libvmmipc.so")

    def print_env(self, args, **env):
        script = ("import os, json; print(json.dumps({k: os.environ.get(k) for k in "
                  "['LD_PRELOAD', 'VMMIPC_RANK', 'VMMIPC_LOG_LEVEL', 'VMMIPC_STATS', "
                  "'VMMIPC_SOCKET_DIR', 'VMMIPC_LOG_FILE', 'LOCAL_RANK', 'RANK', 'DEEPEP_VMMIPC', "
                  "'PYTHONPATH']}))")
        result = run(["--lib", self.lib] + args + ["--", sys.executable, "-c", script],
                     clean_env(**env))
        self.assertEqual(result.returncode, 0, result.stderr)
        import json
        return json.loads(result.stdout.strip().splitlines()[-1])

    def test_command_gets_the_preload_and_the_options(self):
        with tempfile.TemporaryDirectory() as directory:
            seen = self.print_env(["--rank", "3", "--log-level", "INFO", "--stats",
                                   "--socket-dir", os.path.relpath(directory)],
                                  LD_PRELOAD="/nonexistent/libother.so", LOCAL_RANK="5")
        self.assertEqual(seen["LD_PRELOAD"], f"{self.lib}:/nonexistent/libother.so")
        self.assertEqual(seen["VMMIPC_RANK"], "3")
        self.assertEqual(seen["VMMIPC_LOG_LEVEL"], "info")
        self.assertEqual(seen["VMMIPC_STATS"], "1")
        self.assertEqual(seen["VMMIPC_SOCKET_DIR"], os.path.realpath(directory))
        self.assertEqual(seen["LOCAL_RANK"], "5")  # passed through untouched

    def test_a_socket_dir_others_can_write_is_warned_about(self):
        with tempfile.TemporaryDirectory() as directory:
            os.chmod(directory, 0o1777)
            result = run(["--lib", self.lib, "--socket-dir", directory, "--", sys.executable,
                          "-c", "pass"], clean_env())
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"--socket-dir {directory} is writable by group and others (mode 1777)",
                      result.stderr)

    def test_without_options_only_the_preload_changes(self):
        seen = self.print_env([], RANK="7")
        self.assertEqual(seen["LD_PRELOAD"], self.lib)
        self.assertIsNone(seen["VMMIPC_RANK"])
        self.assertIsNone(seen["VMMIPC_STATS"])
        self.assertEqual(seen["RANK"], "7")

    def test_deepep_puts_the_hook_on_pythonpath(self):
        seen = self.print_env(["--deepep"], PYTHONPATH="/elsewhere")
        self.assertEqual(seen["DEEPEP_VMMIPC"], "1")
        self.assertEqual(seen["PYTHONPATH"],
                         os.path.join(SOURCE_DIR, "python") + ":/elsewhere")
        script = "import sys; print('vmmipc.deepep' in sys.modules)"
        result = run(["--lib", self.lib, "--deepep", "--", sys.executable, "-c", script],
                     clean_env())
        self.assertEqual(result.stdout.strip(), "True", result.stderr)

    def test_print_env_is_shell_syntax(self):
        result = run(["--lib", self.lib, "--stats", "--print-env"], clean_env())
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(f"export LD_PRELOAD={self.lib}\n", result.stdout)
        self.assertIn("export VMMIPC_STATS=1\n", result.stdout)

    def test_usage_errors(self):
        self.assertEqual(run([], clean_env()).returncode, 2)
        self.assertEqual(run(["--rank", "-3", "--", "true"], clean_env()).returncode, 2)
        self.assertEqual(run(["--check", "--", "true"], clean_env()).returncode, 2)
        missing = run(["--lib", "/nonexistent/libvmmipc.so", "--", "true"], clean_env())
        self.assertEqual(missing.returncode, 1)
        self.assertIn("libvmmipc.so not found", missing.stderr)
        absent = run(["--lib", self.lib, "--", "/nonexistent/program"], clean_env())
        self.assertEqual(absent.returncode, 127)

    def test_library_is_found_next_to_an_installed_script(self):
        with tempfile.TemporaryDirectory() as prefix:
            os.makedirs(os.path.join(prefix, "bin"))
            os.makedirs(os.path.join(prefix, "lib"))
            shutil.copy(SCRIPT, os.path.join(prefix, "bin", "vmmipc-run"))
            shutil.copytree(os.path.join(PYTHON_DIR, "vmmipc"),
                            os.path.join(prefix, "share", "vmmipc", "python", "vmmipc"))
            shutil.copy(self.lib, os.path.join(prefix, "lib", "libvmmipc.so"))
            result = subprocess.run([sys.executable, os.path.join(prefix, "bin", "vmmipc-run"),
                                     "--print-env"], env=clean_env(), capture_output=True,
                                    text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn(os.path.join(os.path.realpath(prefix), "lib", "libvmmipc.so"),
                          result.stdout)

    def test_a_wrapper_without_its_package_says_so(self):
        with tempfile.TemporaryDirectory() as prefix:
            os.makedirs(os.path.join(prefix, "bin"))
            shutil.copy(SCRIPT, os.path.join(prefix, "bin", "vmmipc-run"))
            result = subprocess.run([sys.executable, os.path.join(prefix, "bin", "vmmipc-run"),
                                     "--print-env"], env=clean_env(), capture_output=True,
                                    text=True)
        self.assertEqual(result.returncode, 1)
        self.assertIn("the vmmipc Python package is not beside this script", result.stderr)
        self.assertNotIn("Traceback", result.stderr)

    def test_log_file_option_sets_an_absolute_name(self):
        seen = self.print_env(["--log-file", "logs/vmmipc.%h.%p.log"])
        self.assertEqual(seen["VMMIPC_LOG_FILE"],
                         os.path.join(os.getcwd(), "logs", "vmmipc.%h.%p.log"))


def wheel_layout(site, lib):
    """The vmmipc package as `pip install .` lays it out in site-packages: the Python
    files, the library inside the package, the DeepEP hook in vmmipc/_site."""
    package = os.path.join(site, "vmmipc")
    shutil.copytree(os.path.join(PYTHON_DIR, "vmmipc"), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    os.makedirs(os.path.join(package, "_site"))
    shutil.copy(os.path.join(PYTHON_DIR, "sitecustomize.py"), os.path.join(package, "_site"))
    if lib:
        shutil.copy(lib, os.path.join(package, "libvmmipc.so"))
    return package


class PackageTest(unittest.TestCase):
    """The launcher and `python -m vmmipc` from an installed package (the wheel's layout)."""

    def python(self, site, args, **env):
        return subprocess.run([sys.executable] + args, env=clean_env(PYTHONPATH=site, **env),
                              capture_output=True, text=True, timeout=120)

    def test_the_library_inside_the_package_is_found(self):
        if not OPTIONS.lib:
            self.skipTest("needs --lib")
        with tempfile.TemporaryDirectory() as site:
            package = wheel_layout(site, OPTIONS.lib)
            lib = os.path.join(os.path.realpath(package), "libvmmipc.so")
            result = self.python(site, ["-m", "vmmipc", "--lib"])
            self.assertEqual((result.returncode, result.stdout), (0, lib + "\n"), result.stderr)
            result = self.python(site, ["-m", "vmmipc", "--print-env"],
                                 LD_PRELOAD="/x/libother.so")
            self.assertEqual(result.stdout, f"export LD_PRELOAD={lib}:/x/libother.so\n")
            # What the console script runs (vmmipc.run:entry), with --deepep's hook.
            script = "import sys; from vmmipc import run; run.entry(sys.argv[1:])"
            result = self.python(site, ["-c", script, "--deepep", "--print-env"])
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn(f"export LD_PRELOAD={lib}\n", result.stdout)
            self.assertIn(f"export PYTHONPATH={os.path.join(os.path.realpath(package), '_site')}:"
                          f"{site}\n", result.stdout)
            result = self.python(site, ["-c", script, "--", sys.executable, "-c",
                                        "import os; print(os.environ['LD_PRELOAD'])"])
            self.assertEqual(result.stdout, lib + "\n", result.stderr)

    def test_a_package_without_the_library_says_where_it_looked(self):
        with tempfile.TemporaryDirectory() as site:
            package = wheel_layout(site, None)
            result = self.python(site, ["-m", "vmmipc", "--lib"])
            self.assertEqual(result.returncode, 1)
            self.assertIn("python -m vmmipc: libvmmipc.so not found (looked at: "
                          f"{os.path.join(os.path.realpath(package), 'libvmmipc.so')})",
                          result.stderr)
            self.assertNotIn("Traceback", result.stderr)
            self.assertEqual(self.python(site, ["-m", "vmmipc"]).returncode, 2)  # usage
            self.assertEqual(self.python(site, ["-m", "vmmipc", "--version"]).stdout.strip(),
                             run_module.VERSION)

    def test_preload_env_puts_the_library_first_once(self):
        sys.path.insert(0, PYTHON_DIR)
        try:
            import vmmipc
        finally:
            sys.path.pop(0)
        env = vmmipc.preload_env({"LD_PRELOAD": "/a/libfoo.so /b/libvmmipc.so", "X": "1"},
                                 library="/c/libvmmipc.so")
        self.assertEqual(env, {"LD_PRELOAD": "/c/libvmmipc.so:/a/libfoo.so", "X": "1"})
        self.assertEqual(vmmipc.preload_env({}, library="/c/libvmmipc.so"),
                         {"LD_PRELOAD": "/c/libvmmipc.so"})

    def test_sizes_are_written_as_the_library_writes_them(self):
        # The cases of tests/unit/log_test.cc LogBytes: --check and the library agree.
        cases = {0: "0 bytes", 512: "512 bytes", 1023: "1023 bytes", 1024: "1 KiB",
                 4 << 20: "4 MiB", (7 << 20) // 2: "3.5 MiB", (4 << 20) + 1: "4.0 MiB",
                 1 << 40: "1 TiB", 100 << 40: "100 TiB", 1 << 63: "8 EiB",
                 (1 << 64) - 1: "16.0 EiB"}
        for size, text in cases.items():
            self.assertEqual(run_module.human_bytes(size), text, size)


class CheckWithoutDriverTest(unittest.TestCase):
    """--check where libcuda cannot be loaded: it explains itself and fails."""

    def test_no_driver_is_a_clear_failure(self):
        args = ["--lib", OPTIONS.lib] if OPTIONS.lib else []
        result = run(args + ["--check"], clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER, LOCAL_RANK="1"))
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        out = result.stdout
        self.assertIn(f"vmmipc {run_module.VERSION}", out)
        self.assertRegex(out, r"\[FAIL\] CUDA driver +" + re.escape(NO_DRIVER) + " cannot be loaded")
        self.assertIn("rank            1 (from LOCAL_RANK)", out)
        self.assertRegex(out, r"sockets +abstract .* network namespace net:\[[0-9]+\]")
        self.assertIn("ptrace", out)
        self.assertRegex(out.splitlines()[-1],
                         r"^VERDICT: FAIL: cannot share memory here: no CUDA driver")
        if OPTIONS.lib:
            self.assertIn(f"[  ok] library         {os.path.abspath(OPTIONS.lib)}", out)

    def test_socket_dir_problems_are_failures(self):
        result = run(["--check", "--socket-dir", "/nonexistent/dir"],
                     clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER))
        self.assertIn("[FAIL] sockets         VMMIPC_SOCKET_DIR=/nonexistent/dir is not a "
                      "directory", result.stdout)
        with tempfile.TemporaryDirectory() as directory:
            deep = os.path.join(directory, "d" * 100)
            os.makedirs(deep, mode=0o700)
            os.chmod(deep, 0o700)  # whatever the umask
            result = run(["--check"], clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER,
                                                VMMIPC_SOCKET_DIR=deep))
        self.assertIn("is too long: socket paths would reach", result.stdout)
        # Like /dev/shm: anyone could create the socket names there first.
        with tempfile.TemporaryDirectory() as directory:
            os.chmod(directory, 0o1777)
            result = run(["--check"], clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER,
                                                VMMIPC_SOCKET_DIR=directory))
        self.assertIn(f"[FAIL] sockets         VMMIPC_SOCKET_DIR={directory} is writable by group "
                      "and others (mode 1777): another user could create socket names in it",
                      result.stdout)
        self.assertIn("belongs to uid 0, not to this process's uid 1",
                      run_module.socket_dir_problem("/", 1))

    def test_layout_problems_are_warned(self):
        result = run(["--check"], clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER,
                                            VMMIPC_ARENA_BASE="0x300000000000",
                                            LOCAL_RANK="9"))
        self.assertIn("VMMIPC_ARENA_BASE=0x300000000000 and VMMIPC_ARENA_SIZE=0x10000000000 is "
                      "ignored: the export arena [0x300000000000, +1 TiB) overlaps the import "
                      "zone [0x300000000000, +8 TiB); the default 0x200000000000 and "
                      "0x10000000000 is used", result.stdout)
        self.assertIn("[WARN] rank            9 (from LOCAL_RANK) is not below VMMIPC_ZONE_SLOTS=8",
                      result.stdout)
        self.assertTrue(result.stdout.rstrip().endswith("(and 2 warnings above)"), result.stdout)


class CheckOnSimulatedDriverTest(unittest.TestCase):
    """--check against the project's simulated libcuda.so.1 (ctest label sim)."""

    def setUp(self):
        if not OPTIONS.sim_dir:
            self.skipTest("needs --sim-dir")

    def check(self, **env):
        args = ["--lib", OPTIONS.lib] if OPTIONS.lib else []
        result = run(args + ["--check"], clean_env(LD_LIBRARY_PATH=OPTIONS.sim_dir, **env))
        return result.returncode, result.stdout

    def test_the_simulated_driver_passes_with_a_warning(self):
        code, out = self.check(LOCAL_RANK="0")
        self.assertEqual(code, 2, out)
        self.assertIn("SIMULATED driver", out)
        self.assertRegex(out, r"\[  ok\] GPU 0 .*VMM yes, POSIX fd yes")
        self.assertIn("[  ok] import zone     0x300000000000 + 8 x 1 TiB: free", out)
        self.assertIn("[  ok] export arena    0x200000000000 + 1 TiB: free", out)
        self.assertIn("[  ok] rank            0 (from LOCAL_RANK)", out)
        self.assertEqual(out.splitlines()[-1], "VERDICT: WARN: sharing should work, but: this "
                         "is vmmipc's simulated test driver, not a GPU driver")

    def test_peer_access_is_listed_for_several_gpus(self):
        code, out = self.check(SIMCUDA_DEVICE_COUNT="2")
        self.assertIn("[  ok] GPU 1", out)
        self.assertIn("[  ok] peer access     every pair of the 2 GPUs", out)

    def test_slots_from_the_gpu_follow_the_host_list(self):
        with tempfile.TemporaryDirectory() as folder:
            for name in ("0000:13:00.0", "0000:10:00.0", "0000:12:00.0", "0000:11:00.0", "bind"):
                os.mkdir(os.path.join(folder, name))
            code, out = self.check(SIMCUDA_DEVICE_COUNT="4", CUDA_VISIBLE_DEVICES="3,1",
                                   VMMIPC_HOST_GPUS=folder)
            self.assertIn("[  ok] rank            device 0 (00000000:13:00.0): slot 3 from the "
                          "GPU (VMMIPC_RANK_FROM=auto", out)
            self.assertIn("device 1 (00000000:11:00.0): slot 1 from the GPU", out)
            self.assertIn("no export arena (VMMIPC_RANK_FROM=gpu turns it on)", out)
            code, out = self.check(SIMCUDA_DEVICE_COUNT="4", CUDA_VISIBLE_DEVICES="2",
                                   VMMIPC_HOST_GPUS=folder, VMMIPC_RANK_FROM="gpu",
                                   LOCAL_RANK="0")
            self.assertIn("device 0 (00000000:12:00.0): slot 2 from the GPU (VMMIPC_RANK_FROM="
                          "gpu", out)
            self.assertIn("export arena on", out)
            os.rmdir(os.path.join(folder, "0000:12:00.0"))
            code, out = self.check(SIMCUDA_DEVICE_COUNT="4", CUDA_VISIBLE_DEVICES="2",
                                   VMMIPC_HOST_GPUS=folder, VMMIPC_RANK_FROM="gpu")
            self.assertIn("[WARN] rank            device 0 (00000000:12:00.0): no slot from the "
                          "GPU: not among the 3 GPUs", out)
            self.assertIn("no rank slot from the GPU for device 0", out.splitlines()[-1])
        code, out = self.check(VMMIPC_RANK_FROM="env")
        self.assertIn("[info] rank            none here (VMMIPC_RANK_FROM=env)", out)

    def test_no_device_fails(self):
        code, out = self.check(SIMCUDA_DEVICE_COUNT="0")
        self.assertEqual(code, 1, out)
        self.assertIn("cuInit failed: CUDA_ERROR_NO_DEVICE", out)
        self.assertIn("VERDICT: FAIL: cannot share memory here: no GPU is visible", out)

    def test_an_unreservable_zone_falls_back(self):
        # Not the default fallback 0x600000000000: in a sanitized build that is where
        # AddressSanitizer's allocator lives (the simulator is sanitized there too).
        # The probe's first reservation is the zone's: the simulator fails it.
        code, out = self.check(VMMIPC_ZONE_FALLBACK_BASE="0x400000000000",
                               SIMCUDA_FAIL="cuMemAddressReserve:1:2")
        self.assertIn("[WARN] import zone     0x300000000000 + 8 x 1 TiB: cannot be reserved: "
                      "CUDA_ERROR_OUT_OF_MEMORY", out)
        self.assertIn("[  ok] fallback zone   0x400000000000", out)
        self.assertIn("the import zone 0x300000000000 cannot be had; the fallback 0x400000000000 "
                      "is used", out)

    def test_no_zone_at_all_means_best_effort(self):
        code, out = self.check(VMMIPC_ZONE_FALLBACK_BASE="0",
                               SIMCUDA_FAIL="cuMemAddressReserve:1:2")
        self.assertIn("fallback zone   disabled", out)
        self.assertIn("neither import zone can be reserved: peer memory is placed best-effort",
                      out)

    def test_a_layout_without_room_turns_parts_off(self):
        code, out = self.check(VMMIPC_ZONE_SLOTS="100", VMMIPC_ZONE_BASE="0x100000000000",
                               LOCAL_RANK="0")
        self.assertIn("import zone     0x100000000000 + 100 x 1 TiB", out)
        self.assertIn("fallback zone   off: the layout has no room for it", out)
        self.assertIn("export arena    off: the layout has no room for it", out)
        self.assertIn("VMMIPC_ARENA_BASE=0x200000000000 and VMMIPC_ARENA_SIZE=0x10000000000 (the "
                      "default): the export arena [0x200000000000, +1 TiB) overlaps the import "
                      "zone [0x100000000000, +100 TiB); export arena off", out)


def main():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--lib")
    parser.add_argument("--sim-dir")
    known, rest = parser.parse_known_args()
    OPTIONS.lib, OPTIONS.sim_dir = known.lib, known.sim_dir
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
