#!/usr/bin/env python3
"""Tests of the GPU check's step set (scripts/gpu_check/gpu_set.py, run by
scripts/gpu-check.sh) without a GPU: what each step runs, how it reads the output, its
rows, its files and its exit status.

The runner runs for real; the tools it calls are one fake (nvidia-smi, cmake, ctest, bash for
tests/bench/run_*.sh, python3 for the harnesses) that records each call and prints what the
real one prints in each case (FAKE_FAIL picks failures). python3 -c, and python3 running the
runner itself, run the real Python.

  test_gpu_check.py [unittest args]

Standard library only. ctest: scripts.gpu_check (unit).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_summary import read_summary  # noqa: E402

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RUNNER = os.path.join(SOURCE_DIR, "scripts", "gpu_check")

FAKE = r'''#!{python}
import json, os, sys
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
fail = os.environ.get("FAKE_FAIL", "").split(",")
def record():
    keys = ("LD_PRELOAD", "VMMIPC_LOG_LEVEL", "GPU_CHECK_BASELINE", "VMMIPC_FOLLOW",
            "LOCAL_RANK", "RANK", "VMMIPC_RANK")
    with open(os.environ["FAKE_CALLS"], "a") as handle:
        env = {{k: os.environ[k] for k in keys if k in os.environ}}
        handle.write(json.dumps({{"tool": tool, "argv": args, "env": env}}) + "\n")
def touch(path, text="", mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)
opt = lambda name: args[args.index(name) + 1]
if tool == "nvidia-smi":
    if os.environ.get("FAKE_GPUS") == "0":
        print("No devices were found"); sys.exit(6)
    print("NVIDIA H200, 580.1" if "noheader" in " ".join(args) else "fake nvidia-smi")
    sys.exit(0)
if tool == "cmake" and args == ["--version"]:
    print("cmake version 3.31"); sys.exit(0)
record()
if tool == "cmake" and args[0] == "-S":
    if "configure" in fail: sys.exit(1)
    touch(os.path.join(opt("-B"), "CMakeCache.txt"), "CMAKE_GENERATOR:INTERNAL=Ninja\n")
    touch(os.path.join(opt("-B"), "CTestTestfile.cmake"))
elif tool == "cmake":
    for name in ("csrc/libvmmipc.so", "tests/gpu/cudart_ipc_client", "tests/bench/vmmipc_bench",
                 "tests/bench/vmmipc_all_to_all", "tests/bench/vmmipc_fetch_bench",
                 "tests/gpu/libvmm_cuda_malloc.so"):
        if name.endswith("libvmmipc.so") and "nolib" in fail: continue
        touch(os.path.join(opt("--build"), name), "", 0o755)
elif tool == "ctest":
    touch(os.path.join(opt("--test-dir"), "Testing/Temporary/LastTest.log"),
          "CHECK cudart.open PASS\nother output\nRESULT cudart ok\n")
    print("1/3 Test  #1: gpu.a ..........   Passed    0.10 sec")
    print("2/3 Test  #2: gpu.b ..........***Skipped   0.10 sec")
    if "ctest" in fail:
        print("3/3 Test  #3: gpu.c ..........***Failed    0.10 sec"); sys.exit(8)
    print("3/3 Test  #3: gpu.c ..........   Passed    0.10 sec")
elif tool == "bash" and args[0].endswith("run_bench.sh"):
    out = opt("--out")
    medians = [{{"aggregate_name": "median"}}] * 3
    touch(os.path.join(out, "bench.json"), json.dumps({{"benchmarks": medians}}))
    touch(os.path.join(out, "benchmarks.md"), "5 met, 1 missed, 0 not measured\n")
    touch(os.path.join(out, "bench.png"))
elif tool == "bash" and args[0].endswith("run_registration.sh"):
    touch(os.path.join(opt("--out"), "registration.md"), "# registration\n")
    print("SUMMARY fetch p50: warm 25.0 us (1.30x the floor), cold 33.0 us, floor 19.0 us")
    print("SUMMARY N=2 K=64 x 2 MiB: warm 1.90x legacy, cold 2.90x legacy")
elif tool == "bash" and args[0].endswith("run_all_to_all.sh"):
    out = opt("--out")
    for name in ("all-to-all-n2-g1.json", "all-to-all-n4-g1.json"):
        touch(os.path.join(out, name), "{{}}")
    touch(os.path.join(out, "all-to-all.md"), "2 met, 0 missed, 1 not measured\n")
elif tool == "bash":
    os.execv("/bin/bash", ["bash"] + args)
elif tool == "python3" and os.path.basename(args[0].rstrip("/")) == "gpu_check":
    os.execv({python!r}, [{python!r}] + args)  # the runner itself (scripts/gpu-check.sh)
elif tool == "python3" and args[:1] == ["-c"]:
    if args[1] == "import cuda.bindings":
        sys.exit(1 if "cuda.bindings" in fail else 0)
    os.execv({python!r}, [{python!r}] + args)
else:
    script = os.path.basename(args[0])
    if script == "vmmipc-run":
        print("[vmmipc-run] rank 0: from the GPU\nnot kept\nVERDICT ok")
    elif script == "torch_ipc_check.py":
        print("CHECK a PASS\nCHECK b PASS\nSUMMARY torch_ipc_check: 2 PASS, 0 FAIL, 0 SKIP")
    elif script == "spawn_slot_check.py":
        if "spawn" in fail:
            print("CHECK one-gpu.slot PASS\nCHECK two-gpus.slot FAIL x\nCHECK two-gpus.ptr FAIL y")
            sys.exit(1)
        print("CHECK one-gpu.slot PASS\nSUMMARY spawn_slot_check: 1 PASS, 0 FAIL, 0 SKIP")
    elif script == "memory_saver_check.py":
        if "saver" in fail:
            print("SKIPPED: no torch_memory_saver"); sys.exit(77)
        print("SUMMARY memory_saver_check: 4 PASS, 0 FAIL, 1 SKIP")
    elif script == "nixl_client_check.py":
        if "nixl-budget" in fail:
            print("CHECK case_a SKIP not run: less than 60 s left")
            print("SUMMARY nixl_client_check: 0 PASS, 0 FAIL, 5 SKIP"); sys.exit(0)
        print("CHECK case_a_ran PASS\nSUMMARY nixl_client_check: 10 PASS, 0 FAIL, 0 SKIP")
    elif script == "ucx_perftest_check.py":
        print("CHECK case_a_ucp_get_ran PASS\nSUMMARY ucx_perftest_check: 10 PASS, 0 FAIL, 0 SKIP")
    elif script == "concurrent_import_floor.py":
        print("RATIO alone: 1.2 / 1.0 = 1.20\nRATIO together: 3.1 / 2 = 1.55")
    elif script == "open_sequence_probe.py":
        print("SET_ACCESS empty 512 MiB 310 us, anchored 20 us")
    else:
        sys.exit("fake: unexpected %s %s" % (tool, args))
'''


class GpuCheckTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        bin_dir = os.path.join(self.tmp.name, "bin")
        os.makedirs(bin_dir)
        fake = os.path.join(self.tmp.name, "fake")
        with open(fake, "w") as handle:
            handle.write(FAKE.format(python=sys.executable))
        os.chmod(fake, 0o755)
        for tool in ("nvidia-smi", "cmake", "ctest", "bash", "python3"):
            os.symlink(fake, os.path.join(bin_dir, tool))
        self.bin_dir = bin_dir
        self.build = os.path.join(self.tmp.name, "build-gpu")
        self.out = os.path.join(self.tmp.name, "out")
        self.calls_file = os.path.join(self.tmp.name, "calls.jsonl")
        self.nixl_wheel = os.path.join(self.tmp.name, "nixl_cu13-1.5.1-cp312-cp312-any.whl")
        with open(self.nixl_wheel, "w"):
            pass
        self.ucx_wheel = os.path.join(self.tmp.name, "libucx_cu13-1.22.0-py3-none-any.whl")
        with open(self.ucx_wheel, "w"):
            pass

    def check(self, extra_env=None, argv=None):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPU_CHECK_", "FAKE_")) and k not in ("OUT", "LD_PRELOAD")}
        env.update(PATH=self.bin_dir + os.pathsep + env.get("PATH", ""), LOCAL_RANK="3",
                   GPU_CHECK_BUILD_DIR=self.build, FAKE_CALLS=self.calls_file,
                   NIXL_WHEEL=self.nixl_wheel, UCX_WHEEL=self.ucx_wheel)
        env.update(extra_env or {})
        result = subprocess.run(argv or [sys.executable, RUNNER, "gpu", self.out], env=env,
                                cwd=self.tmp.name, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
        summary, rows = read_summary(self.out)
        return result, summary, rows

    def all_calls(self):
        with open(self.calls_file) as handle:
            return [json.loads(line) for line in handle]

    def calls(self, script):
        return [c for c in self.all_calls() if os.path.basename(c["argv"][0]) == script]

    def test_everything_passes_on_a_good_machine(self):
        result, summary, rows = self.check()
        self.assertEqual(result.returncode, 0, result.stdout[-3000:])
        self.assertIn("## vmmipc GPU check: PASS", summary)
        self.assertEqual(list(rows), [
            "environment", "configure", "build", "ctest -L gpu", "python check", "spawn check",
            "saver check", "benchmarks", "driver floor", "open sequence", "registration",
            "nixl check", "ucx perftest",
            "all-to-all"])
        self.assertTrue(rows["environment"][1].startswith("NVIDIA H200, 580.1; "))
        self.assertEqual(rows["build"][1], "exit 0; libvmmipc.so: built, cudart_ipc_client: built")
        self.assertEqual(rows["ctest -L gpu"], ("PASS", "2 passed, 0 failed, 1 skipped: "
                                                         "gpu.b=Skipped; exit 0"))
        self.assertEqual(rows["python check"], ("PASS", "2 PASS, 0 FAIL, 0 SKIP; exit 0"))
        self.assertEqual(rows["saver check"], ("PASS", "4 PASS, 0 FAIL, 1 SKIP; exit 0"))
        self.assertEqual(rows["benchmarks"][1], "3 medians, 5 repetitions; targets: 5 met, 1 "
                         "missed, 0 not measured; benchmarks.md, bench.png (exit 0)")
        self.assertEqual(rows["driver floor"][1], "vmm floor / legacy open p50, N=2 one GPU: "
                         "alone 1.20, together 1.55; floor.log (exit 0)")
        self.assertEqual(rows["open sequence"][1],
                         "empty 512 MiB 310 us, anchored 20 us; open-sequence.log (exit 0)")
        self.assertEqual(rows["nixl check"], ("PASS", "10 PASS, 0 FAIL, 0 SKIP; exit 0"))
        self.assertEqual(rows["ucx perftest"], ("PASS", "10 PASS, 0 FAIL, 0 SKIP; exit 0"))
        self.assertEqual(rows["all-to-all"][1], "2 launcher runs; targets: 2 met, 0 missed, 1 not "
                         "measured; all-to-all/all-to-all.md (exit 0)")
        for name in ("env.log", "configure.log", "build.log", "ctest-gpu.log",
                     "ctest-gpu-LastTest.log", "python-check.log", "spawn-check.log",
                     "saver-check.log", "bench.log", "floor.log", "open-sequence.log",
                     "nixl-check.log", "all-to-all.log", "summary.partial.md"):
            self.assertTrue(os.path.isfile(os.path.join(self.out, name)), name)
        with open(os.path.join(self.out, "ctest-gpu.log")) as handle:
            self.assertIn("\nCHECK cudart.open PASS\nRESULT cudart ok\n", handle.read())
        with open(os.path.join(self.out, "spawn-check.log")) as handle:
            spawn_log = handle.read()
        self.assertIn("[vmmipc-run] rank 0: from the GPU\nVERDICT ok\n", spawn_log)
        self.assertNotIn("not kept", spawn_log)

    def test_each_harness_gets_its_environment(self):
        self.check()
        lib = os.path.join(self.build, "csrc", "libvmmipc.so")
        (python,) = self.calls("torch_ipc_check.py")
        self.assertEqual(python["env"], {"LD_PRELOAD": lib, "VMMIPC_LOG_LEVEL": "info",
                                         "GPU_CHECK_BASELINE": "1", "LOCAL_RANK": "3"})
        self.assertEqual(python["argv"][1:], ["--deadline-s", "340"])
        (spawn,) = self.calls("spawn_slot_check.py")
        self.assertNotIn("LOCAL_RANK", spawn["env"])  # workers without a rank variable
        self.assertEqual(spawn["env"]["LD_PRELOAD"], lib)
        (saver,) = self.calls("memory_saver_check.py")
        self.assertEqual(saver["env"]["VMMIPC_FOLLOW"], "1")
        (floor,) = self.calls("concurrent_import_floor.py")
        self.assertEqual(floor["env"]["LD_PRELOAD"], "")
        self.assertEqual(floor["argv"][1:], ["--ranks", "2", "--gpus", "1", "--per-rank", "64",
                                             "--reps", "3"])
        (nixl,) = self.calls("nixl_client_check.py")
        self.assertEqual(nixl["env"]["LD_PRELOAD"], "")  # the check preloads cases b and d
        self.assertEqual(nixl["argv"][1:7], ["--lib", lib, "--cases", "a,b,c,d,e", "--ucx",
                                             "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on"])
        (ctest,) = [c for c in self.all_calls() if c["tool"] == "ctest"]
        self.assertEqual(ctest["env"]["VMMIPC_LOG_LEVEL"], "info")
        self.assertEqual(ctest["argv"][:8], ["--test-dir", self.build, "-L", "gpu", "-LE",
                                             "python", "--output-on-failure", "--timeout"])

    def test_failures_and_skips_are_read_from_the_output(self):
        result, summary, rows = self.check({"FAKE_FAIL": "ctest,spawn,saver,cuda.bindings"})
        self.assertEqual(result.returncode, 1)
        self.assertIn("## vmmipc GPU check: FAIL", summary)
        self.assertEqual(rows["ctest -L gpu"], ("FAIL", "1 passed, 1 failed, 1 skipped: "
                                                         "gpu.b=Skipped gpu.c=Failed; exit 8"))
        self.assertEqual(rows["spawn check"], ("FAIL", "1 PASS, 2 FAIL, 0 SKIP (no SUMMARY "
                                                        "line); failed: two-gpus.slot "
                                                        "two-gpus.ptr; exit 1"))
        self.assertEqual(rows["saver check"][0], "SKIP")
        self.assertEqual(rows["driver floor"], ("SKIP", "no cuda.bindings"))
        self.assertNotIn("open sequence", rows)

    def test_the_nixl_step_needs_its_wheel(self):
        self.nixl_wheel = os.path.join(self.tmp.name, "no-such-nixl.whl")
        result, _, rows = self.check()
        self.assertEqual(result.returncode, 0, result.stdout[-2000:])
        self.assertEqual(rows["nixl check"], ("SKIP", "not run: nixl wheel missing"))
        self.assertEqual(self.calls("nixl_client_check.py"), [])

    def test_a_check_whose_every_case_skipped_is_a_skip(self):
        result, _, rows = self.check({"FAKE_FAIL": "nixl-budget"})
        self.assertEqual(result.returncode, 0, result.stdout[-2000:])
        self.assertEqual(rows["nixl check"], ("SKIP", "0 PASS, 0 FAIL, 5 SKIP; exit 0"))

    def test_the_ucx_step_needs_its_wheel(self):
        self.ucx_wheel = os.path.join(self.tmp.name, "no-such-libucx.whl")
        result, _, rows = self.check()
        self.assertEqual(result.returncode, 0, result.stdout[-2000:])
        self.assertEqual(rows["ucx perftest"], ("SKIP", "not run: libucx wheel missing"))
        self.assertEqual(self.calls("ucx_perftest_check.py"), [])

    def test_a_failed_configure_leaves_nothing_to_run(self):
        result, _, rows = self.check({"FAKE_FAIL": "configure"})
        self.assertEqual(result.returncode, 1)
        self.assertEqual(rows["configure"], ("FAIL", "cmake -B %s Release (exit 1)" % self.build))
        self.assertEqual(rows["build"], ("SKIP", "not configured"))
        self.assertEqual(rows["ctest -L gpu"], ("SKIP", "no build tree"))
        lib = os.path.join(self.build, "csrc", "libvmmipc.so")
        self.assertEqual(rows["python check"], ("FAIL", "not run: %s was not built" % lib))
        self.assertIn("not built (Google Benchmark missing?", rows["benchmarks"][1])
        self.assertIn("vmmipc_all_to_all not built (see build.log)", rows["all-to-all"][1])

    def test_a_build_without_the_library_fails(self):
        # The build exits 0 (a target left out, a stale tree) but there is no
        # libvmmipc.so: not a PASS (issue 36 item 6).
        result, summary, rows = self.check({"FAKE_FAIL": "nolib"})
        self.assertEqual(result.returncode, 1)
        lib = os.path.join(self.build, "csrc", "libvmmipc.so")
        self.assertEqual(rows["build"][0], "FAIL")
        self.assertIn("libvmmipc.so: MISSING", rows["build"][1])
        self.assertEqual(rows["python check"], ("FAIL", "not run: %s was not built" % lib))

    def test_without_a_gpu(self):
        result, summary, rows = self.check({"FAKE_GPUS": "0", "GPU_CHECK_SKIP": "bench,all_to_all"})
        self.assertEqual(result.returncode, 1)
        self.assertTrue(rows["environment"][1].startswith("no GPU visible to nvidia-smi"))
        self.assertIn(", no GPU, commit ", summary)
        result, _, rows = self.check({"FAKE_GPUS": "0", "GPU_CHECK_ALLOW_NO_GPU": "1",
                                      "GPU_CHECK_SKIP": "bench,all_to_all"})
        self.assertEqual(result.returncode, 0)
        self.assertEqual(rows["environment"][0], "SKIP")

    def test_the_skip_list_and_the_budget(self):
        skip = {"GPU_CHECK_SKIP": "ctest,python,spawn,saver,floor,nixl",
                "GPU_CHECK_BUDGET_S": "100"}
        result, _, rows = self.check(skip)
        self.assertEqual(result.returncode, 0)
        for name in ("ctest", "python", "spawn", "saver", "floor", "nixl"):
            self.assertEqual(rows[name], ("SKIP", "GPU_CHECK_SKIP"))
        self.assertNotIn("open sequence", rows)
        # Under 120 s left, the benchmark takes 3 repetitions.
        self.assertIn("3 medians, 3 repetitions", rows["benchmarks"][1])
        self.assertEqual(rows["all-to-all"][0], "PASS")
        self.assertEqual(rows["registration"], (
            "PASS", "fetch p50: warm 25.0 us (1.30x the floor), cold 33.0 us, floor 19.0 us; "
            "N=2 K=64 x 2 MiB: warm 1.90x legacy, cold 2.90x legacy; "
            "registration/registration.md (exit 0)"))
        result, _, rows = self.check(dict(skip, GPU_CHECK_BUDGET_S="70"))
        self.assertEqual(result.returncode, 0)
        self.assertRegex(rows["all-to-all"][1], r"^only [0-9]+s of budget left; run it alone "
                         "with GPU_CHECK_SKIP=ctest,python,bench$")

    def test_the_wrapper_takes_the_output_folder(self):
        everything = "ctest,python,spawn,saver,bench,floor,registration,nixl,ucx,all_to_all"
        result, _, rows = self.check({"GPU_CHECK_SKIP": everything},
                                     ["/bin/bash", os.path.join(SOURCE_DIR, "scripts",
                                                                "gpu-check.sh"), self.out])
        self.assertEqual(result.returncode, 0, result.stdout[-2000:])
        self.assertEqual(rows["all_to_all"], ("SKIP", "GPU_CHECK_SKIP"))

    def test_the_dry_run_names_every_step_and_runs_nothing(self):
        env = dict(os.environ, PATH=self.bin_dir + os.pathsep + os.environ["PATH"],
                   FAKE_CALLS=self.calls_file, GPU_CHECK_BUILD_DIR=self.build)
        text = subprocess.run([sys.executable, RUNNER, "gpu", self.out, "--dry-run"], env=env,
                              stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
        for number, name in enumerate(["environment", "configure", "build", "ctest -L gpu",
                                       "python check", "spawn check", "saver check", "benchmarks",
                                       "driver floor", "open sequence", "registration",
                                       "nixl check", "ucx perftest",
                                       "all-to-all"], 1):
            self.assertIn("\n%d. %s  (" % (number, name), text)
        self.assertIn("tests/python/torch_ipc_check.py --deadline-s 340", text)
        self.assertFalse(os.path.exists(self.calls_file))
        self.assertFalse(os.path.exists(self.out))


if __name__ == "__main__":
    unittest.main(verbosity=2)
