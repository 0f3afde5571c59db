#!/usr/bin/env python3
"""Tests of the launcher (the package vmmipc in python/, run through its wrapper
scripts/vmmipc-run) and of vmmipc-config, which it asks: the tool's report (every
variable with its source and error, the layout, the rank, the slots from the GPU, the
socket verdict, its usage errors), the launcher showing what the tool says, LD_PRELOAD
handling, the run mode's environment, where it finds the library and the tool (install
tree, wheel), `python -m vmmipc`, and --check without a driver and (with --sim-dir) on
the simulated driver.

  test_vmmipc_run.py --lib build/csrc/libvmmipc.so [--tool build/csrc/vmmipc-config]
                     [--sim-dir build/sim] [unittest args]

Standard library only. ctest: scripts.vmmipc_run (unit) and scripts.vmmipc_run_check_sim (sim).
"""

import argparse
import io
import json
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
OPTIONS = argparse.Namespace(lib=None, tool=None, sim_dir=None)
NO_DRIVER = "libcuda-that-does-not-exist.so.1"

sys.path.insert(0, PYTHON_DIR)
import vmmipc  # noqa: E402  (from this source tree)
from vmmipc import check_driver, preload, run as run_module, settled  # noqa: E402


def clean_env(**extra):
    """The test's environment without any VMMIPC_*/rank variables, plus `extra`. The
    build of --lib is the source tree's BUILD_DIR, so that what the launcher finds
    without --lib is that build's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VMMIPC_") and k not in ("LOCAL_RANK", "RANK", "LD_PRELOAD",
                                                        "DEEPEP_VMMIPC", "SIMCUDA_DEVICE_COUNT")}
    if OPTIONS.lib:
        env["BUILD_DIR"] = os.path.dirname(os.path.dirname(os.path.abspath(OPTIONS.lib)))
    env.update(extra)
    return env


def run(args, env, **kwargs):
    return subprocess.run([sys.executable, SCRIPT] + args, env=env, capture_output=True,
                          text=True, timeout=120, **kwargs)


def tool_path():
    if OPTIONS.tool:
        return os.path.abspath(OPTIONS.tool)
    if OPTIONS.lib:
        return os.path.join(os.path.dirname(os.path.abspath(OPTIONS.lib)), "vmmipc-config")
    return None


def tool(args=(), **env):
    """vmmipc-config's report in clean_env(**env): (exit status, parsed JSON or None, stderr)."""
    result = subprocess.run([tool_path()] + list(args), env=clean_env(**env),
                            capture_output=True, text=True, timeout=60)
    report = json.loads(result.stdout) if result.returncode == 0 and result.stdout else None
    return result.returncode, report, result.stderr


CONFIGURATION_DOC = os.path.join(SOURCE_DIR, "docs", "configuration.md")
TABLE_BEGIN = ("<!-- generated: vmmipc-config --markdown (from csrc/config/params.def); "
               "edit params.def -->")  # csrc/tool/markdown.h
TABLE_END = "<!-- end of the generated table -->"


def documented_table(text=None):
    """The generated table of docs/configuration.md, between its markers."""
    if text is None:
        with open(CONFIGURATION_DOC) as handle:
            text = handle.read()
    start = text.index(TABLE_BEGIN) + len(TABLE_BEGIN)
    return text[start:text.index(TABLE_END)].strip("\n") + "\n"


def update_doc():
    """--update-doc: writes vmmipc-config --markdown into docs/configuration.md."""
    table = subprocess.run([tool_path(), "--markdown"], capture_output=True, text=True,
                           check=True).stdout
    with open(CONFIGURATION_DOC) as handle:
        text = handle.read()
    start = text.index(TABLE_BEGIN) + len(TABLE_BEGIN)
    text = text[:start] + "\n\n" + table + "\n" + text[text.index(TABLE_END):]
    with open(CONFIGURATION_DOC, "w") as handle:
        handle.write(text)


class VersionTest(unittest.TestCase):
    def test_version_matches_the_project(self):
        with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as handle:
            version = re.search(r"project\(vmmipc VERSION ([0-9.]+)", handle.read()).group(1)
        self.assertEqual(run_module.VERSION, version)
        self.assertEqual(vmmipc.__version__, version)
        with open(os.path.join(SOURCE_DIR, "pyproject.toml")) as handle:
            self.assertEqual(re.search(r'^version = "([0-9.]+)"', handle.read(), re.M).group(1),
                             version)
        if tool_path():
            out = subprocess.run([tool_path(), "--version"], capture_output=True, text=True)
            self.assertEqual(out.stdout, f"vmmipc-config {version}\n")


class ToolTest(unittest.TestCase):
    """vmmipc-config's report: the library's own settling, as JSON."""

    def setUp(self):
        if not tool_path():
            self.skipTest("needs --lib or --tool")

    def report(self, *args, **env):
        code, report, stderr = tool(args, **env)
        self.assertEqual(code, 0, stderr)
        return report

    def variable(self, report, name):
        return next(v for v in report["variables"] if v["name"] == name)

    def test_every_variable_of_params_def_is_reported_in_order(self):
        with open(os.path.join(SOURCE_DIR, "csrc", "config", "params.def")) as handle:
            declared = re.findall(r'VMMIPC_(?:TEST_)?PARAM\(\s*\w+,\s*"(\w+)",\s*k\w+,\s*"([^"]*)"',
                                  handle.read())
        report = self.report()
        self.assertEqual([(v["name"], v["default"]) for v in report["variables"]], declared)
        for variable in report["variables"]:
            self.assertEqual((variable["source"], variable["set"], variable["error"]),
                             ("default", None, None), variable["name"])
        self.assertEqual(report["warnings"], [])
        self.assertTrue(report["summary"].startswith("config: all defaults;"), report["summary"])
        self.assertEqual(self.variable(report, "VMMIPC_ZONE_BASE")["value"], 0x300000000000)
        self.assertIs(self.variable(report, "VMMIPC_ENABLE")["value"], True)

    def test_values_are_settled_as_the_library_settles_them(self):
        report = self.report(VMMIPC_TIMEOUT_MS="0", VMMIPC_LOG_LEVEL=" WARNING ",
                             VMMIPC_SLOT_SIZE="512G", VMMIPC_LOGLEVEL="info")
        timeout = self.variable(report, "VMMIPC_TIMEOUT_MS")
        self.assertEqual((timeout["value"], timeout["source"], timeout["set"]),
                         (5000, "ignored", "0"))
        self.assertEqual(timeout["error"], "ignoring VMMIPC_TIMEOUT_MS='0': must be between 1 and "
                         "3600000; using the default 5000")
        level = self.variable(report, "VMMIPC_LOG_LEVEL")
        self.assertEqual((level["value"], level["source"]), ("warn", "environment"))
        self.assertEqual(self.variable(report, "VMMIPC_SLOT_SIZE")["text"], "0x8000000000")
        self.assertEqual(report["unknown_variables"], ["VMMIPC_LOGLEVEL"])
        # 512 GiB slots leave the default 1 TiB arena no room: off, and said so.
        self.assertEqual(report["warnings"][0], timeout["error"])
        self.assertIn("export arena off", report["warnings"][1])
        self.assertEqual(self.variable(report, "VMMIPC_ARENA")["source"], "layout")
        self.assertEqual(report["layout"]["arena"], dict(report["layout"]["arena"], on=False,
                                                         no_room=True))

    def test_unknown_names_are_warned_about_with_the_likely_name(self):
        report = self.report(VMMIPC_LOGLEVEL="info", vmmipc_stats="1", VMMIPC_EXPORT_ANCHOR="0")
        self.assertEqual(report["unknown_variables"], ["VMMIPC_LOGLEVEL", "vmmipc_stats"])
        self.assertIn("ignoring VMMIPC_LOGLEVEL='info': not a vmmipc variable; did you mean "
                      "VMMIPC_LOG_LEVEL?", report["warnings"])
        self.assertIn("ignoring vmmipc_stats='1': not a vmmipc variable; did you mean "
                      "VMMIPC_STATS?", report["warnings"])

    def test_the_log_file_is_judged_without_creating_it(self):
        self.assertEqual(self.report()["log_file"],
                         {"pattern": "", "path": None, "usable": True, "problem": None})
        with tempfile.TemporaryDirectory() as directory:
            fine = os.path.join(directory, "v.log")
            self.assertEqual(self.report(VMMIPC_LOG_FILE=fine)["log_file"],
                             {"pattern": fine, "path": fine, "usable": True, "problem": None})
            missing = os.path.join(directory, "no", "v.log")
            self.assertEqual(self.report(VMMIPC_LOG_FILE=missing)["log_file"]["problem"],
                             f"cannot open VMMIPC_LOG_FILE '{missing}': No such file or "
                             "directory; logging to stderr")
            log_file = self.report(VMMIPC_LOG_FILE=directory)["log_file"]
            self.assertFalse(log_file["usable"])
            self.assertIn("it is a directory", log_file["problem"])
            self.assertEqual(os.listdir(directory), [])  # nothing created

    def test_the_docs_table_is_generated_from_params_def(self):
        result = subprocess.run([tool_path(), "--markdown"], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(documented_table(), result.stdout,
                         "docs/configuration.md's table differs from vmmipc-config --markdown: "
                         "run test_vmmipc_run.py --tool build/csrc/vmmipc-config --update-doc")
        # Every variable, in order; the ranges are the library's, refused in its words.
        rows = [line for line in result.stdout.splitlines() if line.startswith("| `VMMIPC_")]
        self.assertEqual(len(rows), len(self.report()["variables"]))
        self.assertIn("| `VMMIPC_ZONE_SLOTS` | `8` | 1 to 65534 |", result.stdout)
        self.assertIn("| `VMMIPC_SLOT_SIZE` | `1T` | a positive multiple of 2 MiB (a size) |",
                      result.stdout)
        self.assertIn("`warn` (`warning`)", result.stdout)
        self.assertIn("`off` (`none`)", result.stdout)
        warm = self.variable(self.report(VMMIPC_WARM_CONNECTIONS="5000"),
                             "VMMIPC_WARM_CONNECTIONS")
        self.assertEqual(warm["reason"], "must be between 0 and 4096")

    def test_the_layout_is_the_librarys(self):
        # params_test.cc's ParamsLayout cases, through the tool.
        report = self.report(VMMIPC_ZONE_SLOTS="2", VMMIPC_SLOT_SIZE="0x8000000002000000")
        zone = report["layout"]["zone"]
        self.assertEqual((zone["slots"], zone["slot_size"], zone["size"]), (8, 1 << 40, 8 << 40))
        self.assertIn("the import zone (slots x slot size) overflows 64 bits",
                      report["warnings"][0])
        report = self.report(VMMIPC_ZONE_SLOTS="100", VMMIPC_ZONE_BASE="0x100000000000")
        layout = report["layout"]
        self.assertEqual((layout["zone"]["on"], layout["zone"]["base"]), (True, 0x100000000000))
        self.assertEqual((layout["fallback"]["on"], layout["fallback"]["no_room"]), (False, True))
        self.assertEqual((layout["arena"]["on"], layout["arena"]["no_room"]), (False, True))
        report = self.report(VMMIPC_ZONE_FALLBACK_BASE="0", VMMIPC_ARENA="0")
        self.assertEqual([(report["layout"][p]["on"], report["layout"][p]["no_room"])
                          for p in ("fallback", "arena")], [(False, False), (False, False)])
        self.assertEqual(report["layout"]["address_end"], 1 << 47)

    def test_the_rank_and_its_fallbacks_are_the_librarys(self):
        def rank(**env):
            info = self.report(**env)["rank"]
            return info["rank"], info["source"]

        self.assertEqual(rank(), (-1, "none"))
        self.assertEqual(rank(LOCAL_RANK="2", RANK="9"), (2, "LOCAL_RANK"))
        self.assertEqual(rank(VMMIPC_RANK="1", LOCAL_RANK="2"), (1, "VMMIPC_RANK"))
        self.assertEqual(rank(LOCAL_RANK="x", RANK="4"), (4, "RANK"))
        self.assertEqual(rank(VMMIPC_RANK_FROM="gpu", VMMIPC_RANK="1"), (-1, "none"))
        report = self.report(LOCAL_RANK="70000")
        self.assertEqual(report["warnings"], ["ignoring LOCAL_RANK='70000': not a rank between 0 "
                                              "and 65534"])
        self.assertEqual(self.variable(self.report(LOCAL_RANK="2"), "VMMIPC_RANK")["source"],
                         "LOCAL_RANK")
        info = self.report(VMMIPC_RANK_FROM="gpu")["rank"]
        self.assertEqual((info["slot_from_gpu"], info["arena_wanted"]), (True, True))
        info = self.report(LOCAL_RANK="9")["rank"]
        self.assertEqual((info["fits_zone"], info["zone_slots"]), (False, 8))

    def test_slots_from_the_gpu_follow_the_host_list(self):
        with tempfile.TemporaryDirectory() as folder:
            for name in ("0000:13:00.0", "0000:10:00.0", "0000:11:00.0", "bind"):
                os.mkdir(os.path.join(folder, name))
            report = self.report("--pci", "00000000:13:00.0", "--pci=0000:12:00.0", "--pci", "x",
                                 VMMIPC_HOST_GPUS=folder)
        first, missing, bad = report["gpus"]
        self.assertEqual((first["address"], first["index"], first["count"], first["list"],
                          first["slot"], first["fits_zone"]),
                         ("0000:13:00.0", 2, 3, folder, 2, True))
        self.assertEqual((missing["slot"], missing["why_not"]),
                         (None, f"0000:12:00.0 is not among the 3 GPUs that {folder} lists"))
        self.assertEqual((bad["address"], bad["why_not"]), (None, "'x' is not a PCI address"))
        gpu = self.report("--pci", "0000:13:00.0", VMMIPC_HOST_GPUS="/nonexistent")["gpus"][0]
        self.assertIn("no list of the host's GPUs: /nonexistent cannot be read", gpu["why_not"])
        # A rank from a variable is every GPU's slot; VMMIPC_RANK_FROM=env: none from the GPU.
        self.assertEqual(self.report("--pci", "0000:13:00.0", LOCAL_RANK="5")["gpus"][0]["slot"],
                         5)
        self.assertIsNone(self.report("--pci", "0000:13:00.0", VMMIPC_HOST_GPUS=folder,
                                      VMMIPC_RANK_FROM="env")["gpus"][0]["slot"])

    def test_the_socket_verdict_is_the_librarys(self):
        sockets = self.report()["sockets"]
        self.assertEqual((sockets["kind"], sockets["usable"], sockets["problem"]),
                         ("abstract", True, None))
        self.assertEqual(sockets["pattern"], f"@vmmipc.{os.geteuid()}.i<instance>")
        self.assertRegex(sockets["network_namespace"], r"^net:\[[0-9]+\]$")
        with tempfile.TemporaryDirectory() as directory:
            os.chmod(directory, 0o700)
            sockets = self.report(VMMIPC_SOCKET_DIR=directory)["sockets"]
            self.assertEqual((sockets["kind"], sockets["usable"]), ("directory", True))
            self.assertEqual(sockets["pattern"],
                             os.path.join(directory, f"vmmipc.{os.geteuid()}.i<instance>.sock"))
            self.assertLessEqual(sockets["longest_path"], sockets["path_limit"])
            os.chmod(directory, 0o1777)
            sockets = self.report(VMMIPC_SOCKET_DIR=directory)["sockets"]
            self.assertEqual(sockets["problem"], "not_private")
            self.assertTrue(sockets["why"].startswith("is writable by group and others (mode "
                                                      "1777)"), sockets["why"])
            os.chmod(directory, 0o700)
            deep = os.path.join(directory, "d" * 100)
            os.mkdir(deep, 0o700)
            sockets = self.report(VMMIPC_SOCKET_DIR=deep)["sockets"]
            self.assertEqual(sockets["problem"], "too_long")
            self.assertIn("longer than the 107 a Unix socket allows", sockets["why"])
        sockets = self.report(VMMIPC_SOCKET_DIR="/nonexistent/dir")["sockets"]
        self.assertEqual((sockets["problem"], sockets["why"]),
                         ("missing", "cannot be used: No such file or directory"))
        with tempfile.NamedTemporaryFile() as plain:
            self.assertEqual(self.report(VMMIPC_SOCKET_DIR=plain.name)["sockets"]["problem"],
                             "not_directory")

    def test_a_directory_of_another_user_is_not_private(self):
        with tempfile.TemporaryDirectory() as directory:
            other = os.path.join(directory, "other")
            os.mkdir(other, 0o700)
            if os.geteuid() == 0:
                os.chown(other, 1, 1)
            else:
                other = "/"  # root's
            sockets = self.report(VMMIPC_SOCKET_DIR=other)["sockets"]
        self.assertEqual(sockets["problem"], "not_private")
        self.assertIn("not to this process's uid", sockets["why"])

    def test_usage_errors_are_clear(self):
        for args, message in ((["--pci"], "--pci needs a PCI address"),
                              (["--frobnicate"], "unknown argument '--frobnicate'")):
            code, report, stderr = tool(args)
            self.assertEqual((code, report), (2, None), args)
            self.assertIn(f"vmmipc-config: {message}", stderr)
            self.assertIn("usage: vmmipc-config", stderr)
        result = subprocess.run([tool_path(), "--help"], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0)
        self.assertIn("usage: vmmipc-config [--pci ADDRESS]", result.stdout)


class LauncherShowsTheToolTest(unittest.TestCase):
    """What the launcher prints is what vmmipc-config settles, not a copy of the rules."""

    def setUp(self):
        if not OPTIONS.lib:
            self.skipTest("needs --lib")

    def test_check_shows_every_warning_and_the_settled_values(self):
        env = dict(VMMIPC_CUDA_LIBRARY=NO_DRIVER, VMMIPC_ZONE_SLOTS="100",
                   VMMIPC_ZONE_BASE="0x100000000000", VMMIPC_TIMEOUT_MS="0",
                   VMMIPC_LOGLEVEL="info", RANK="3", VMMIPC_SOCKET_DIR="/nonexistent/dir")
        _, report, _ = tool(**env)
        result = run(["--lib", OPTIONS.lib, "--check"], clean_env(**env))
        lines = result.stdout.splitlines()
        for warning in report["warnings"]:
            self.assertIn(f"[WARN] config          {warning}", lines)
        self.assertIn("[WARN] config          ignoring VMMIPC_LOGLEVEL='info': not a vmmipc "
                      "variable; did you mean VMMIPC_LOG_LEVEL?", lines)
        self.assertIn(f"[  ok] rank            3 (from {report['rank']['source']}) (a global "
                      "rank: on a multi-node job set LOCAL_RANK or VMMIPC_RANK)", lines)
        self.assertIn("[FAIL] sockets         VMMIPC_SOCKET_DIR=/nonexistent/dir "
                      f"{report['sockets']['why']}", lines)

    def test_check_shows_what_settings_do_together_as_the_library_says_it(self):
        # One list (csrc/config/cross_settings.cc) feeds the library's log and the tool.
        env = dict(VMMIPC_CUDA_LIBRARY=NO_DRIVER, VMMIPC_AHEAD="1", VMMIPC_FOLLOW="0")
        _, report, _ = tool(**env)
        line = ("VMMIPC_AHEAD=1 does nothing with VMMIPC_FOLLOW=0 (announcements come over the "
                "follow connection, and its events drop what was mapped ahead when the exporter "
                "unmaps it)")
        self.assertIn(line, report["warnings"])
        result = run(["--lib", OPTIONS.lib, "--check"], clean_env(**env))
        self.assertIn(f"[WARN] config          {line}", result.stdout.splitlines())

    def test_check_says_whether_this_process_follows(self):
        # Follow is the default (issue 43): --check says so; VMMIPC_FOLLOW=0 is a warning.
        base = dict(VMMIPC_CUDA_LIBRARY=NO_DRIVER)
        lines = run(["--lib", OPTIONS.lib, "--check"], clean_env(**base)).stdout.splitlines()
        self.assertTrue(any(l.startswith("[info] follow          on (the default)") for l in lines),
                        lines)
        off = run(["--lib", OPTIONS.lib, "--check"],
                  clean_env(VMMIPC_FOLLOW="0", **base)).stdout.splitlines()
        self.assertTrue(any(l.startswith("[WARN] follow          VMMIPC_FOLLOW=0: legacy IPC's")
                            for l in off), off)

    def test_options_are_settled_by_the_tool(self):
        result = run(["--lib", OPTIONS.lib, "--log-level", "Warning", "--print-env"], clean_env())
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("export VMMIPC_LOG_LEVEL=warn\n", result.stdout)
        _, report, _ = tool(VMMIPC_LOG_LEVEL="loud")
        result = run(["--lib", OPTIONS.lib, "--log-level", "loud", "--", "true"], clean_env())
        self.assertEqual(result.returncode, 2, result.stderr)
        reason = next(v["reason"] for v in report["variables"] if v["name"] == "VMMIPC_LOG_LEVEL")
        self.assertEqual(reason, "not a log level (trace, debug, info, warn, error or off)")
        self.assertEqual(result.stderr, f"vmmipc-run: error: --log-level: 'loud' is {reason}\n")

    def test_without_the_tool_the_check_fails_and_says_why(self):
        with tempfile.TemporaryDirectory() as directory:
            lib = os.path.join(directory, "libvmmipc.so")
            shutil.copy(OPTIONS.lib, lib)
            result = run(["--lib", lib, "--check"], clean_env(BUILD_DIR="/nonexistent"))
            self.assertEqual(result.returncode, 1, result.stdout)
            self.assertIn(f"[FAIL] config          vmmipc-config not found (looked at: "
                          f"{os.path.join(directory, 'vmmipc-config')}", result.stdout)
            result = run(["--lib", lib, "--rank", "2", "--", "true"],
                         clean_env(BUILD_DIR="/nonexistent"))
            self.assertEqual(result.returncode, 1)
            self.assertIn("vmmipc-run: cannot check the options: vmmipc-config not found",
                          result.stderr)
            self.assertNotIn("Traceback", result.stderr)

class LauncherTest(unittest.TestCase):
    """Run mode: LD_PRELOAD, the variables, exec."""

    def setUp(self):
        if not OPTIONS.lib:
            self.skipTest("needs --lib")
        self.lib = os.path.abspath(OPTIONS.lib)

    def test_preload_is_prepended_once_and_others_are_kept(self):
        prepend = preload.prepend_preload
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
        bad_rank = run(["--rank", "-3", "--", "true"], clean_env())
        self.assertEqual(bad_rank.returncode, 2)
        self.assertEqual("vmmipc-run: error: --rank: '-3' must be between 0 and 65534 (or -1 for "
                         "unranked)\n", bad_rank.stderr)
        # The option as the user typed it, not the variable it sets.
        not_a_number = run(["--rank", "abc", "--", "true"], clean_env())
        self.assertEqual((not_a_number.returncode, not_a_number.stderr),
                         (2, "vmmipc-run: error: --rank: 'abc' is not a whole number\n"))
        self.assertEqual(run(["--check", "--", "true"], clean_env()).returncode, 2)
        bad_rank = run(["--check", "--rank", "70000"], clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER))
        self.assertEqual((bad_rank.returncode, bad_rank.stdout), (2, ""))
        self.assertIn("vmmipc-run: error: --rank: '70000' must be between 0 and 65534",
                      bad_rank.stderr)
        missing = run(["--lib", "/nonexistent/libvmmipc.so", "--", "true"], clean_env())
        self.assertEqual(missing.returncode, 1)
        # What to do, for pip users and for a source tree.
        self.assertIn("vmmipc-run: --lib /nonexistent/libvmmipc.so: no such file. Installed with "
                      "pip: reinstall the package", missing.stderr)
        self.assertIn("A source tree: build it (scripts/setup.sh", missing.stderr)
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
            shutil.copy(tool_path(), os.path.join(prefix, "bin", "vmmipc-config"))
            # --log-level is settled by the install tree's bin/vmmipc-config.
            result = subprocess.run([sys.executable, os.path.join(prefix, "bin", "vmmipc-run"),
                                     "--log-level", "INFO", "--print-env"],
                                    env=clean_env(BUILD_DIR="/nonexistent"),
                                    capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn(os.path.join(os.path.realpath(prefix), "lib", "libvmmipc.so"),
                          result.stdout)
            self.assertIn("export VMMIPC_LOG_LEVEL=info", result.stdout)

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


# Run with the library preloaded: a dlsym of a hooked driver name makes the library read its
# configuration (no driver needed); then a marker on stderr; then a hook, which without a
# driver logs one error line. Prints the process's fds before and after each step.
CONFIG_READ_PROBE = r"""
import ctypes, json, os, sys
def fds():
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[name] = os.readlink("/proc/self/fd/" + name)
        except OSError:
            pass  # the listing's own fd, closed since
    return found
before = fds()
lib = ctypes.CDLL(None)
lib.cuIpcOpenMemHandle
after_read = fds()
sys.stderr.write("MARK: configuration read\n")
sys.stderr.flush()
lib.cuIpcGetMemHandle((ctypes.c_char * 64)(), ctypes.c_uint64(0))
print(json.dumps({"before": before, "after_read": after_read, "after_line": fds()}))
"""


class LibraryReadsItsConfigurationTest(unittest.TestCase):
    """What the library says when it reads its configuration (its first use, never at load
    time): a bad VMMIPC_LOG_FILE at once, in one line on stderr, then stderr logging; the log
    file opened then, with no fd left behind when it is refused; unknown VMMIPC_* names."""

    def setUp(self):
        if not OPTIONS.lib:
            self.skipTest("needs --lib")
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)

    def probe(self, **env):
        env = clean_env(LD_PRELOAD=os.path.abspath(OPTIONS.lib), VMMIPC_CUDA_LIBRARY=NO_DRIVER,
                        **env)
        result = subprocess.run([sys.executable, "-c", CONFIG_READ_PROBE], env=env,
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout), result.stderr.splitlines()

    def test_a_bad_log_file_is_one_line_at_the_configuration_read(self):
        fifo = os.path.join(self.dir, "fifo.log")
        os.mkfifo(fifo, 0o600)  # nobody reads it: the open must not wait
        link = os.path.join(self.dir, "link.log")
        os.symlink(os.path.join(self.dir, "target"), link)
        cases = {os.path.join(self.dir, "no", "v.%p.log"): "cannot open VMMIPC_LOG_FILE",
                 self.dir: "it is a directory", fifo: "it is a FIFO",
                 link: "it is a symbolic link"}
        for pattern, why in cases.items():
            with self.subTest(pattern=pattern):
                fds, lines = self.probe(VMMIPC_LOG_FILE=pattern)
                self.assertEqual(len(lines), 3, lines)
                self.assertRegex(lines[0], r"^\[vmmipc pid \d+ unranked\] warning: cannot (open|use) "
                                 r"VMMIPC_LOG_FILE '.*; logging to stderr$")
                self.assertIn(why, lines[0])
                self.assertEqual(lines[1], "MARK: configuration read")  # said before the marker
                self.assertIn("error: cannot load the CUDA driver", lines[2])  # stderr goes on
                self.assertEqual(fds["after_read"], fds["before"])  # nothing kept open
                self.assertEqual(fds["after_line"], fds["before"])
        self.assertFalse(os.path.exists(os.path.join(self.dir, "target")))

    def test_a_good_log_file_is_opened_at_the_configuration_read(self):
        pattern = os.path.join(self.dir, "v.%p.log")
        fds, lines = self.probe(VMMIPC_LOG_FILE=pattern)
        self.assertEqual(lines, ["MARK: configuration read"])
        [name] = os.listdir(self.dir)
        path = os.path.join(self.dir, name)
        opened = {fd: target for fd, target in fds["after_read"].items()
                  if fds["before"].get(fd) != target}
        self.assertEqual(list(opened.values()), [path])  # one fd more: the log file
        self.assertEqual(fds["after_line"], fds["after_read"])
        with open(path) as handle:
            self.assertIn("error: cannot load the CUDA driver", handle.read())

    def test_unknown_names_are_warned_about_by_the_library(self):
        _, lines = self.probe(VMMIPC_LOGLEVEL="info")
        self.assertRegex(lines[0], r"^\[vmmipc pid \d+ unranked\] warning: ignoring "
                         r"VMMIPC_LOGLEVEL='info': not a vmmipc variable; did you mean "
                         r"VMMIPC_LOG_LEVEL\?$")
        self.assertEqual(lines[1], "MARK: configuration read")

    def test_check_judges_the_log_file(self):
        missing = os.path.join(self.dir, "no", "v.log")
        result = run(["--lib", OPTIONS.lib, "--check", "--log-file", missing],
                     clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER))
        self.assertIn(f"[WARN] log file        cannot open VMMIPC_LOG_FILE '{missing}': No such "
                      "file or directory; logging to stderr", result.stdout.splitlines())
        self.assertIn("(and 1 warnings above)", result.stdout)  # the verdict counts it
        fine = os.path.join(self.dir, "v.%p.log")
        result = run(["--lib", OPTIONS.lib, "--check"],
                     clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER, VMMIPC_LOG_FILE=fine))
        self.assertIn(f"[  ok] log file        lines go to {fine} (", result.stdout)
        self.assertEqual(os.listdir(self.dir), [])  # the check creates nothing


def wheel_layout(site, lib):
    """The vmmipc package as `pip install .` lays it out in site-packages: the Python
    files, the library and vmmipc-config inside the package, the DeepEP hook in
    vmmipc/_site."""
    package = os.path.join(site, "vmmipc")
    shutil.copytree(os.path.join(PYTHON_DIR, "vmmipc"), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    os.makedirs(os.path.join(package, "_site"))
    shutil.copy(os.path.join(PYTHON_DIR, "sitecustomize.py"), os.path.join(package, "_site"))
    if lib:
        shutil.copy(lib, os.path.join(package, "libvmmipc.so"))
        shutil.copy(tool_path(), os.path.join(package, "vmmipc-config"))
    return package


class PackageTest(unittest.TestCase):
    """The launcher and `python -m vmmipc` from an installed package (the wheel's layout)."""

    def test_a_log_line_starts_no_process(self):
        # DeepEP's workers log through vmmipc.log: no vmmipc-config per worker.
        def no_tool(*args, **kwargs):
            raise AssertionError("vmmipc.log ran vmmipc-config")
        saved_settle, saved_popen, saved_stderr = settled.settle, subprocess.Popen, sys.stderr
        settled.settle, subprocess.Popen, sys.stderr = no_tool, no_tool, io.StringIO()
        try:
            vmmipc.log("info", "deep_ep.Buffer: passed through")
            line = sys.stderr.getvalue()
        finally:
            settled.settle, subprocess.Popen, sys.stderr = saved_settle, saved_popen, saved_stderr
        self.assertEqual(line, f"[vmmipc pid {os.getpid()}] info: deep_ep.Buffer: passed through\n")

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
            # The package's own vmmipc-config answers `python -m vmmipc --config`.
            result = self.python(site, ["-m", "vmmipc", "--config"], LOCAL_RANK="4",
                                 BUILD_DIR="/nonexistent")
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(json.loads(result.stdout)["rank"]["rank"], 4)

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
            result = self.python(site, ["-m", "vmmipc", "--config"], BUILD_DIR="/nonexistent")
            self.assertEqual(result.returncode, 1)
            self.assertIn("python -m vmmipc: vmmipc-config not found (looked at: "
                          f"{os.path.join(os.path.realpath(package), 'vmmipc-config')}",
                          result.stderr)

    def test_preload_env_puts_the_library_first_once(self):
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
            self.assertEqual(check_driver.human_bytes(size), text, size)


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
        self.assertIn("[FAIL] sockets         VMMIPC_SOCKET_DIR=/nonexistent/dir cannot be used: "
                      "No such file or directory", result.stdout)
        self.assertIn("VMMIPC_SOCKET_DIR /nonexistent/dir does not exist", result.stdout)
        with tempfile.TemporaryDirectory() as directory:
            deep = os.path.join(directory, "d" * 100)
            os.makedirs(deep, mode=0o700)
            os.chmod(deep, 0o700)  # whatever the umask
            result = run(["--check"], clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER,
                                                VMMIPC_SOCKET_DIR=deep))
        self.assertIn(f"is too long: socket path '{deep}/vmmipc.", result.stdout)
        # Like /dev/shm: anyone could create the socket names there first.
        with tempfile.TemporaryDirectory() as directory:
            os.chmod(directory, 0o1777)
            result = run(["--check"], clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER,
                                                VMMIPC_SOCKET_DIR=directory))
        self.assertIn(f"[FAIL] sockets         VMMIPC_SOCKET_DIR={directory} is writable by group "
                      "and others (mode 1777): another user could create socket names in it",
                      result.stdout)

    def test_layout_problems_are_warned(self):
        result = run(["--check"], clean_env(VMMIPC_CUDA_LIBRARY=NO_DRIVER,
                                            VMMIPC_ARENA_BASE="0x300000000000",
                                            LOCAL_RANK="9"))
        self.assertIn("[WARN] config          ignoring VMMIPC_ARENA_BASE=0x300000000000 and "
                      "VMMIPC_ARENA_SIZE=0x10000000000: the export arena [0x300000000000, +1 TiB) "
                      "overlaps the import zone [0x300000000000, +8 TiB); using the default "
                      "0x200000000000 and 0x10000000000", result.stdout)
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
                          "GPU: 0000:12:00.0 is not among the 3 GPUs", out)
            self.assertIn("no rank slot from the GPU for device 0", out.splitlines()[-1])
        code, out = self.check(VMMIPC_RANK_FROM="env")
        self.assertIn("[info] rank            none here (VMMIPC_RANK_FROM=env)", out)

    def in_namespaces(self, unshare_args, **env):
        """--check run by unshare(1) with `unshare_args`; skipped where refused."""
        probe = subprocess.run(["unshare"] + unshare_args + ["true"], capture_output=True,
                               text=True)
        if probe.returncode != 0:
            self.skipTest(f"unshare {' '.join(unshare_args)} is refused here: "
                          f"{probe.stderr.strip()}")
        args = ["--lib", OPTIONS.lib] if OPTIONS.lib else []
        result = subprocess.run(["unshare"] + unshare_args + [sys.executable, SCRIPT] + args +
                                ["--check"], env=clean_env(LD_LIBRARY_PATH=OPTIONS.sim_dir, **env),
                                capture_output=True, text=True, timeout=120)
        return result.stdout

    def test_in_a_user_namespace_the_check_names_the_uid_outside(self):
        # Like a rootless container's root: a uid inside other than the one outside.
        uid = os.geteuid()
        inside = 0 if uid != 0 else 1000
        out = self.in_namespaces([f"--map-user={inside}", f"--map-group={inside}"])
        self.assertIn(f"[info] user            uid {inside} in a user namespace, uid {uid} "
                      f"outside it: ranks share memory only with processes that are uid {uid} "
                      "outside", out)
        self.assertIn(f"abstract (@vmmipc.{uid}.i<instance>)", out)

    def test_in_an_unmapped_user_namespace_the_check_fails_naming_the_overflow_uid(self):
        # Issue 36 item 2: `unshare --user` without a map makes this process the
        # overflow uid, which every other user's process reads as too: vmmipc
        # neither serves nor imports there, and the check says so.
        with open("/proc/sys/kernel/overflowuid") as f:
            overflow = int(f.read())
        out = self.in_namespaces(["--user"])
        line = next((l for l in out.splitlines() if "] sockets" in l), "")
        self.assertTrue(line.startswith("[FAIL] sockets"), out)
        self.assertIn(f"this process runs as the overflow uid {overflow}", line)
        self.assertIn(f"uid {overflow} is the overflow uid", out.splitlines()[-1])

    def test_in_another_network_namespace_the_check_says_which_and_what_reaches_it(self):
        here = os.readlink("/proc/self/ns/net")
        unshare = ["--net"] if os.geteuid() == 0 else ["--user", "--map-current-user", "--net"]
        out = self.in_namespaces(unshare)
        line = next((l for l in out.splitlines() if "] sockets" in l), "")
        self.assertIn("abstract (@vmmipc.", line, out)
        self.assertIn("in network namespace net:[", line)
        self.assertNotIn(here, line, "the check did not run in the new network namespace")
        self.assertIn("only processes in this network namespace reach these names", line)
        self.assertIn("for a peer in another one set VMMIPC_SOCKET_DIR to a directory every rank "
                      "mounts", line)
        with tempfile.TemporaryDirectory() as folder:
            os.chmod(folder, 0o700)
            out = self.in_namespaces(unshare, VMMIPC_SOCKET_DIR=folder)
            self.assertIn(f"[  ok] sockets         files in {folder} (writable; crosses network "
                          "namespaces", out)

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
    parser.add_argument("--tool")
    parser.add_argument("--sim-dir")
    parser.add_argument("--update-doc", action="store_true")
    known, rest = parser.parse_known_args()
    OPTIONS.lib, OPTIONS.tool, OPTIONS.sim_dir = known.lib, known.tool, known.sim_dir
    if known.update_doc:
        update_doc()
        return
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
