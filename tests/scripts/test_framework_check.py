#!/usr/bin/env python3
"""Tests of scripts/framework-check.sh (the runner's framework step set,
scripts/gpu_check/framework_set.py) without a GPU: its steps, the way it reads the
harnesses' output, and its summary and exit status.

The check runs for real; what it calls is faked: nvidia-smi (two GPUs, or none) and
the Python that runs the harnesses (tests/frameworks/*.py), which prints what the real
harness prints in each case (vLLM's "Failed: Cuda error ...custom_all_reduce.cuh:455
'invalid argument'" without vmmipc, SUMMARY lines, JSON with pointers and latencies;
DeepEP's failure without vmmipc, its in-place build; the SGLang path's SUMMARY and
MEASURE lines). The `compare` step runs the real harness code.

  test_framework_check.py --lib build/csrc/libvmmipc.so [unittest args]

Standard library only. ctest: scripts.framework_check (unit).
"""

import argparse
import os
import stat
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_summary import read_summary  # noqa: E402

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(SOURCE_DIR, "scripts", "framework-check.sh")
OPTIONS = argparse.Namespace(lib=None)

FAKE_NVIDIA_SMI = """#!/bin/sh
[ "${FAKE_GPUS:-2}" = 0 ] && { echo "No devices were found"; exit 6; }
case "$*" in
  *index*noheader*) echo 0; echo 1 ;;
  *name,driver_version*noheader*) echo "NVIDIA H200, 580.159.04"; echo "NVIDIA H200, 580.159.04" ;;
  *) echo "fake nvidia-smi $*" ;;
esac
"""

# The Python the script calls ($PYTHON). FAKE_* variables pick the outcome.
FAKE_PYTHON = '''#!{python}
import json, os, subprocess, sys
sys.path.insert(0, {frameworks!r})
args = sys.argv[1:]
if args[:1] == ["-c"]:
    sys.exit(subprocess.call([{python!r}] + args))
if args[:2] == ["-m", "torch.distributed.run"]:
    args = args[5:]  # --standalone --nproc-per-node 2
script, rest = os.path.basename(args[0]), args[1:]
preloaded = "libvmmipc" in os.environ.get("LD_PRELOAD", "")
expandable = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
if script == "vllm_custom_ar.py" and rest[0] == "build":
    print("BUILT /fake/build/vllm_custom_ar.so")
elif script == "vllm_custom_ar.py" and rest[0] == "compare":
    import vllm_custom_ar
    sys.exit(vllm_custom_ar.main(rest))
elif script == "vllm_custom_ar.py" and rest[0] == "run":
    out = rest[rest.index("--out") + 1]
    print("CHECK rank0 vllm.eager.bfloat16.8192 PASS bit-exact")
    if expandable and not preloaded and os.environ.get("FAKE_NO_FAILURE") != "1":
        print("STEP rank0 get_graph_buffer_ipc_meta + register_graph_buffers")
        print("Failed: Cuda error /src/csrc/custom_all_reduce.cuh:455 'invalid argument'")
        sys.exit(1)
    if preloaded:
        print("[vmmipc pid 7 rank 0] info: vmmipc 0.1.0 exporting: rank 0 (LOCAL_RANK)")
    slower = float(os.environ.get("FAKE_SLOWER", "1.0")) if preloaded else 1.0
    # FAKE_MOVING names a counter file: each fresh run gets other peer pointers.
    shift = 0
    if os.environ.get("FAKE_MOVING"):
        counter = os.environ["FAKE_MOVING"]
        shift = int(open(counter).read() or 0) if os.path.exists(counter) else 0
        with open(counter, "w") as handle:
            handle.write(str(shift + 0x1000))
    import vllm_custom_ar
    ranks = [{{"rank": r, "checks": [], "staging_peer_ptrs": [1, 2],
              "graph_peer_ptrs": [[0x200000000000, 0x310000000000 + shift]],
              "graph_own_ptrs": [0x200000000000],
              "latency_us": {{str(s): [slower * (5 + s / 1e6)] for s in vllm_custom_ar.LATENCY_SIZES}}}}
             for r in range(2)]
    with open(out, "w") as handle:
        json.dump({{"ranks": ranks, "failed": 0}}, handle)
    print("SUMMARY vllm_custom_ar: 98 PASS, 0 FAIL (2 ranks)")
elif script == "deepep_intranode.py":
    if not preloaded:
        print("RuntimeError: Failed: CUDA error /src/csrc/deep_ep.cpp:98 'invalid argument'")
        sys.exit(1)
    print("[vmmipc pid 8 rank 0] info: deep_ep.Buffer: use_fabric is False already; "
          "vmmipc.deepep passes every argument through unchanged")
    if os.environ.get("FAKE_DEEPEP_NO_RESULT") != "1":
        print("RESULT deepep_intranode: every rank's test_loop returned")
elif script == "deepep_build.py":
    if os.environ.get("FAKE_DEEPEP_BUILD_FAIL") == "1":
        print("ERROR built, but deep_ep does not import from /fake/DeepEP")
        sys.exit(1)
    print("BUILT " + rest[rest.index("--deepep-src") + 1])
elif script == "sglang_vmm_path.py":
    if os.environ.get("FAKE_SGLANG_FAIL") == "1":
        print("CHECK rank0 sglang.path_reads_peer_tensors FAIL 3/16 peer tensors right")
        print("SUMMARY rank0 sglang_vmm_path: 1 PASS, 1 FAIL")
        sys.exit(1)
    if preloaded:
        print("MEASURE rank0 sglang_path_ms 8.94 vmmipc_legacy_ipc_ms 4.22 "
              "ratio_vmmipc_over_sglang 0.47 (medians of 3 rounds, 16 x 8 MiB tensors a rank)")
    print("SUMMARY rank0 sglang_vmm_path: 3 PASS, 0 FAIL")
else:
    sys.exit("fake python: unexpected " + " ".join(sys.argv[1:]))
'''


def executable(path, text):
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class FrameworkCheckTest(unittest.TestCase):

    def setUp(self):
        if not OPTIONS.lib:
            self.skipTest("needs --lib")
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        root = self.tmp.name
        os.makedirs(os.path.join(root, "bin"))
        executable(os.path.join(root, "bin", "nvidia-smi"), FAKE_NVIDIA_SMI)
        self.python = os.path.join(root, "python")
        executable(self.python, FAKE_PYTHON.format(
            python=sys.executable, frameworks=os.path.join(SOURCE_DIR, "tests", "frameworks")))
        # Importable stand-ins for the DeepEP step's checks.
        site = os.path.join(root, "site")
        for package, text in (("deep_ep", ""), ("torch_memory_saver", "")):
            os.makedirs(os.path.join(site, package))
            with open(os.path.join(site, package, "__init__.py"), "w") as handle:
                handle.write(text)
        with open(os.path.join(site, "torch_memory_saver", "utils.py"), "w") as handle:
            handle.write("def get_binary_path_from_package(stem):\n"
                         "    return '/fake/torch_memory_saver_hook_mode_preload_cu13.abi3.so'\n")
        self.site = site
        self.sources = os.path.join(root, "src")
        os.makedirs(self.sources)

    def check(self, extra_env=None, args=None):
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "OUT", "VLLM_SRC", "DEEPEP_SRC", "VMMIPC_LIB",
                            "PYTORCH_CUDA_ALLOC_CONF", "SGLANG_SRC", "DEEPEP_BUILD",
                            "MEMORY_SAVER_WHEEL")}
        env.update(PATH=os.path.join(self.tmp.name, "bin") + os.pathsep + env.get("PATH", ""),
                   PYTHON=self.python, PYTHONPATH=self.site,
                   FRAMEWORK_CHECK_BUILD_DIR=os.path.join(self.tmp.name, "build"))
        env.update(extra_env or {})
        out = os.path.join(self.tmp.name, "out")
        if args is None:
            args = ["--vllm-src", self.sources, "--deepep-src", self.sources]
        result = subprocess.run(["bash", SCRIPT, "--lib", OPTIONS.lib, "--out", out] + args,
                                env=env, capture_output=True, text=True, timeout=120)
        summary, rows = read_summary(out)
        return result, summary, rows

    def test_everything_as_expected(self):
        result, summary, rows = self.check()
        self.assertEqual(result.returncode, 0, result.stdout[-3000:])
        self.assertIn("## vmmipc framework check: PASS", summary)
        self.assertEqual(rows["vllm without vmmipc"][0], "PASS")
        self.assertIn("custom_all_reduce.cuh:455 'invalid argument'", rows["vllm without vmmipc"][1])
        for name in ("vllm vmmipc-1", "vllm vmmipc-2", "vllm legacy-1", "vllm legacy-2"):
            self.assertEqual(rows[name][0], "PASS", name)
        self.assertIn("vmmipc exporting lines: 1", rows["vllm vmmipc-1"][1])
        self.assertEqual(rows["vllm pointers"], ("PASS", rows["vllm pointers"][1]))
        self.assertIn("IDENTICAL", rows["vllm pointers"][1])
        self.assertEqual(rows["vllm latency"][0], "PASS")
        self.assertIn("| 8 MiB |", summary)
        self.assertEqual(rows["deepep without vmmipc"][0], "PASS")
        self.assertIn("deep_ep.cpp:98 'invalid argument'", rows["deepep without vmmipc"][1])
        self.assertEqual(rows["deepep with vmmipc"][0], "PASS")
        self.assertIn("use_fabric is False already", rows["deepep with vmmipc"][1])

    def test_deepep_exiting_0_without_its_result_line_fails(self):
        # Exit 0 is not a pass: a test that returned early (or never ran its
        # loop) prints no RESULT line (issue 36 item 6).
        result, _, rows = self.check({"FAKE_DEEPEP_NO_RESULT": "1"})
        self.assertEqual(result.returncode, 1)
        self.assertEqual(rows["deepep with vmmipc"][0], "FAIL")
        self.assertIn("exited 0 without its RESULT line", rows["deepep with vmmipc"][1])

    def test_a_failure_not_reproduced_without_vmmipc_fails_the_check(self):
        result, _, rows = self.check({"FAKE_NO_FAILURE": "1"})
        self.assertEqual(result.returncode, 1)
        self.assertEqual(rows["vllm without vmmipc"][0], "FAIL")

    def test_a_latency_miss_is_reported_not_failed(self):
        result, summary, rows = self.check({"FAKE_SLOWER": "1.10"})
        self.assertEqual(result.returncode, 0, summary)
        self.assertEqual(rows["vllm latency"][0], "MISSED")
        self.assertIn("0 sizes within 3%, 11 outside", rows["vllm latency"][1])
        self.assertIn("| 1.100 | NO", summary)

    def test_moving_pointers_fail_the_check(self):
        result, _, rows = self.check({"FAKE_MOVING": os.path.join(self.tmp.name, "counter")})
        self.assertEqual(result.returncode, 1)
        self.assertEqual(rows["vllm pointers"][0], "FAIL")
        self.assertIn("DIFFERENT", rows["vllm pointers"][1])

    def test_sglang_path_beside_vmmipc(self):
        result, summary, rows = self.check(args=["--sglang-src", self.sources])
        self.assertEqual(result.returncode, 0, result.stdout[-3000:])
        self.assertEqual(rows["sglang without vmmipc"][0], "PASS")
        self.assertIn("3 PASS, 0 FAIL", rows["sglang without vmmipc"][1])
        self.assertEqual(rows["sglang with vmmipc"][0], "PASS")
        self.assertIn("vmmipc_legacy_ipc_ms 4.22", rows["sglang with vmmipc"][1])
        self.assertEqual(rows["vllm"][0], "SKIP")

    def test_a_failing_sglang_run_fails_the_check(self):
        result, _, rows = self.check({"FAKE_SGLANG_FAIL": "1"}, args=["--sglang-src", self.sources])
        self.assertEqual(result.returncode, 1)
        self.assertEqual(rows["sglang without vmmipc"][0], "FAIL")
        self.assertIn("1 PASS, 1 FAIL", rows["sglang with vmmipc"][1])

    def test_deepep_built_in_place_goes_on_the_path(self):
        result, _, rows = self.check(args=["--deepep-src", self.sources, "--deepep-build"])
        self.assertEqual(result.returncode, 0, result.stdout[-3000:])
        self.assertEqual(rows["deepep build"][0], "PASS")
        self.assertIn(self.sources, rows["deepep build"][1])
        self.assertEqual(rows["deepep with vmmipc"][0], "PASS")

    def test_a_failed_deepep_build_fails_the_check(self):
        result, _, rows = self.check({"FAKE_DEEPEP_BUILD_FAIL": "1"},
                                     args=["--deepep-src", self.sources, "--deepep-build"])
        self.assertEqual(result.returncode, 1)
        self.assertEqual(rows["deepep build"][0], "FAIL")
        self.assertIn("does not import", rows["deepep build"][1])

    def test_the_variables_instead_of_the_options(self):
        result, summary, rows = self.check({"VLLM_SRC": self.sources, "DEEPEP_SRC": self.sources},
                                           args=[])
        self.assertEqual(result.returncode, 0, result.stdout[-3000:])
        self.assertEqual(rows["vllm pointers"][0], "PASS")
        self.assertEqual(rows["deepep with vmmipc"][0], "PASS")

    def test_without_gpus_nothing_runs(self):
        result, summary, rows = self.check({"FAKE_GPUS": "0"})
        self.assertEqual(result.returncode, 2, summary)
        self.assertIn("NOTHING RAN", summary)
        # "No devices were found" is not a GPU.
        self.assertEqual(rows["environment"],
                         ("SKIP", "0 GPUs visible: these checks need 2; nothing below runs"))
        self.assertEqual(rows["vllm"][0], "SKIP")
        self.assertEqual(rows["deepep"][0], "SKIP")

    def test_without_source_trees_nothing_runs(self):
        result, summary, rows = self.check(args=[])
        self.assertEqual(result.returncode, 2, summary)
        self.assertIn("no vLLM source tree", rows["vllm"][1])
        self.assertIn("no DeepEP source tree", rows["deepep"][1])

    def test_an_unknown_argument(self):
        result = subprocess.run(["bash", SCRIPT, "--no-such-option"], capture_output=True,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--no-such-option", result.stderr)

    def test_the_dry_run_names_every_step(self):
        result = subprocess.run(["bash", SCRIPT, "--dry-run", "--vllm-src", self.sources,
                                 "--deepep-src", self.sources, "--deepep-build",
                                 "--sglang-src", self.sources, "--out", self.tmp.name],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        names = ["environment", "saver wheel", "deepep build", "library", "library", "vllm build",
                 "vllm build", "vllm without vmmipc", "vllm vmmipc-1", "vllm legacy-1",
                 "vllm vmmipc-2", "vllm legacy-2", "vllm pointers", "vllm latency",
                 "sglang without vmmipc", "sglang with vmmipc", "deepep without vmmipc",
                 "deepep with vmmipc"]
        for number, name in enumerate(names, 1):
            self.assertRegex(result.stdout, r"\n *%d\. %s  \(" % (number, name))
        self.assertIn("--deepep-src %s --memory-saver --num-processes 2" % self.sources,
                      result.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "summary.md")))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib")
    known, rest = parser.parse_known_args()
    OPTIONS.lib = known.lib
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
