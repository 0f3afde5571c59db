"""The GPU check (scripts/gpu-check.sh [OUTDIR]): the one command for the GPU machine.

OUTDIR: default $OUT if set, else build-gpu/report. Steps: environment, configure + build
(build-gpu, Release), ctest -L gpu (the cudart client and its baseline), the PyTorch /
cuda.bindings / CuPy check with its baseline, spawn workers without a rank variable
(tests/python/spawn_slot_check.py), importers following an exporter's memory-saver pause and
resume with VMMIPC_FOLLOW=1 (tests/python/memory_saver_check.py: raw cuda.bindings VMM memory,
and torch_memory_saver from its wheel in .whl/ unless installed), benchmarks if built, the
driver's own import floor under concurrency beside legacy IPC
(tests/bench/concurrent_import_floor.py) and one open's driver calls
(tests/bench/open_sequence_probe.py), NIXL's UCX backend as a client, with and without vmmipc
(tests/python/nixl_client_check.py, when nixl is installed or its wheel is in .whl/ or
NIXL_WHEEL; else a SKIP row "not run: nixl wheel missing"), the all-to-all registration
benchmark (skipped, not failed, when less than 60 s of budget is left). Every step runs
whatever happened before it, under a timeout, inside one time budget (GPU_CHECK_BUDGET_S,
default 510 s). Each log is teed into OUTDIR; the end prints a markdown table (also
OUTDIR/summary.md; the rows so far in OUTDIR/summary.partial.md). Exit: 0 when no step
failed, 1 otherwise.

Knobs: GPU_CHECK_BUILD_DIR (build-gpu), GPU_CHECK_ALLOW_NO_GPU=1 (no GPU is a skip, for trying
the check on a CPU machine), GPU_CHECK_BENCH_REPETITIONS (5; 3 when less than 120 s are left),
GPU_CHECK_BENCH_SCALE (1: iteration counts multiplier), GPU_CHECK_ALL_TO_ALL_BUDGET_S (180: the
matrix is sized for it), GPU_CHECK_ALL_TO_ALL_REPS (3), MEMORY_SAVER_WHEEL (the
torch_memory_saver wheel for the saver step; default .whl/torch_memory_saver-*.whl),
NIXL_WHEEL (the nixl wheel for the NIXL step; default .whl/nixl_cu13-*.whl), UCX_WHEEL (the
libucx-cu13 wheel whose ucx_perftest the UCX step runs; default .whl/libucx_cu13-*.whl),
GPU_CHECK_SKIP (comma list of steps not to run: ctest, python, spawn, saver, bench, floor,
registration, nixl, ucx, all_to_all; e.g. GPU_CHECK_SKIP=ctest,python,bench to give the all-to-all
step the budget).
"""

import glob
import os
import re
import shutil
import time

from .engine import Context, described_commit, utc_minute
from .steps import (FAIL, LAUNCHER, PASS, SKIP, CheckSet, Cmd, Gate, Note, Step, env_int,
                    harness, status_result)

VERSIONS = '''
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "cuda.bindings", "cupy", "numpy"):
    try:
        mod = importlib.import_module(name)
        version = getattr(mod, "__version__", "?")
        if name == "torch":
            version += " (CUDA %s, available: %s)" % (mod.version.cuda, mod.cuda.is_available())
        print(name, version)
    except Exception as exc:
        print(name, "missing (%s: %s)" % (type(exc).__name__, exc))
'''
TARGETS = r"^[0-9]+ met, [0-9]+ missed, [0-9]+ not measured"
NO_RANK = ("LOCAL_RANK", "RANK", "VMMIPC_RANK")
# The UCX setting of the NIXL step: UCX 1.23 turns cuda_ipc's READ (get zcopy) off on a GPU
# with no NVLink peer ("auto"), so two processes on one GPU read at TCP's speed without it
# (docs/recipes.md, NIXL / UCX).
NIXL_UCX = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on"


class GpuContext(Context):
    def __init__(self, repo, out, env, dry_run=False):
        super().__init__(repo, out, env, dry_run)
        self.build_dir = env.get("GPU_CHECK_BUILD_DIR", "build-gpu")
        self.lib = os.path.join(repo, self.build_dir, "csrc", "libvmmipc.so")
        self.bench = os.path.join(self.build_dir, "tests", "bench", "vmmipc_bench")
        self.a2a_bin = os.path.join(self.build_dir, "tests", "bench", "vmmipc_all_to_all")
        self.fetch_bin = os.path.join(self.build_dir, "tests", "bench", "vmmipc_fetch_bench")
        self.launcher = LAUNCHER
        self.bench_scale = env.get("GPU_CHECK_BENCH_SCALE", "1")
        self.bench_reps_wanted = env_int(env, "GPU_CHECK_BENCH_REPETITIONS", 5)
        self.a2a_want = env_int(env, "GPU_CHECK_ALL_TO_ALL_BUDGET_S", 180) + 20
        self.a2a_reps = env.get("GPU_CHECK_ALL_TO_ALL_REPS", "3")
        self.allow_no_gpu = env.get("GPU_CHECK_ALLOW_NO_GPU", "0") == "1"
        self.nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self.gpu_line = "no GPU"
        self.commit = described_commit(repo)
        self.configured = False
        self._cuda_bindings = None
        self._nixl = None
        self.nixl_ucx = NIXL_UCX

    def cache(self):
        return os.path.join(self.repo, self.build_dir, "CMakeCache.txt")

    @property
    def generator(self):
        """An existing tree keeps its generator; a new one gets Ninja when there is one."""
        if os.path.isfile(self.cache()):
            return []
        return ["-G", "Ninja"] if self.found("ninja") else ["-G", "Unix Makefiles"]

    @property
    def keep_going(self):
        """Past a broken target, so that the library and the GPU clients still get built."""
        try:
            with open(self.cache()) as handle:
                kind = next((line.split("=", 1)[1] for line in handle
                             if line.startswith("CMAKE_GENERATOR:")), "")
        except OSError:
            kind = " ".join(self.generator) if self.dry_run else ""
        if "Ninja" in kind:
            return ["--", "-k", "0"]
        return ["--", "-k"] if "Makefiles" in kind else []

    @property
    def py_deadline(self):  # the harness winds down before its timeout hits
        return self.limit - 20 if self.limit > 40 else 20

    @property
    def bench_reps(self):
        reps = self.bench_reps_wanted
        return 3 if self.limit < 120 and reps > 3 else reps

    @property
    def bench_budget(self):
        return self.limit - 10 if self.limit > 30 else self.limit

    @property
    def a2a_limit(self):
        return self.budget.limit(self.a2a_want)

    @property
    def a2a_budget(self):
        return self.limit - 15

    @property
    def nixl_budget(self):
        return self.limit - 15 if self.limit > 45 else self.limit

    def nixl(self):
        """nixl importable, or its wheel at hand (NIXL_WHEEL, .whl/nixl_cu13-*.whl)."""
        if self._nixl is None:
            wheel = self.env.get("NIXL_WHEEL")
            if wheel:
                self._nixl = os.path.isfile(wheel)
            else:
                self._nixl = bool(glob.glob(os.path.join(self.repo, ".whl", "nixl_cu13-*.whl")))
            if not self._nixl:
                self._nixl = self.probe(["python3", "-c", "import nixl_cu13"])[0] == 0
        return self._nixl

    def ucx_wheel(self):
        """The libucx-cu13 wheel at hand (UCX_WHEEL, .whl/libucx_cu13-*.whl)."""
        wheel = self.env.get("UCX_WHEEL")
        if wheel:
            return os.path.isfile(wheel)
        return bool(glob.glob(os.path.join(self.repo, ".whl", "libucx_cu13-*.whl")))

    def cuda_bindings(self):
        if self._cuda_bindings is None:
            self._cuda_bindings = self.probe(["python3", "-c", "import cuda.bindings"])[0] == 0
        return self._cuda_bindings


# --- notes and judges ------------------------------------------------------------------------


def env_lines(c):
    changed = len(c.probe(["git", "status", "--short"])[1].splitlines())
    return ["date -u: " + time.strftime("%a %b %e %H:%M:%S UTC %Y", time.gmtime()),
            "host: " + c.probe(["uname", "-a"])[1].strip(),
            "repo: %s, commit %s, %d changed files" % (c.repo, c.commit, changed),
            "outdir: %s, budget %ds" % (c.out, c.budget.total_s)]


def gpu_line(c):
    if not c.found("nvidia-smi"):
        return ["nvidia-smi: not found"]
    # Only a real "name, driver" CSV row counts ("No devices were found" has no comma).
    rows = c.probe(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], 20)
    c.gpu_line = next((line for line in rows[1].splitlines() if "," in line), "")
    return []


def tool_lines(c):
    lines = []
    for tool in ("nvcc", "cmake", "ninja", "g++"):
        if not c.found(tool):
            lines.append("%s: not found" % tool)
            continue
        text = c.probe([tool, "--version"])[1].splitlines()
        if tool == "nvcc":
            text = [line for line in text if "release" in line]
        lines.append("%s: %s" % (tool, text[0] if text else ""))
    return lines


def libcuda_line(c):
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    found = [line.strip() for line in c.probe([ldconfig, "-p"])[1].splitlines()
             if "libcuda.so.1" in line]
    return ["libcuda: " + (found[0] if found else "")]


def judge_env(c, out):
    """PASS when nvidia-smi lists a GPU; without one SKIP when GPU_CHECK_ALLOW_NO_GPU=1, else
    FAIL (nothing below is verified). The detail: the GPU and the torch/cupy/cuda.bindings
    versions."""
    versions = " ".join(" ".join(line.split(" ")[:2]) for line in out.lines()
                        if re.match(r"^(torch|cupy|cuda.bindings) ", line))
    if c.gpu_line and c.gpu_line != "no GPU":
        return PASS, "%s; %s" % (c.gpu_line, versions)
    c.gpu_line = "no GPU"
    if c.allow_no_gpu:
        return SKIP, "no GPU visible (GPU_CHECK_ALLOW_NO_GPU=1); " + versions
    return FAIL, "no GPU visible to nvidia-smi: nothing below is verified; " + versions


def judge_configure(c, out):
    """By cmake's exit status; a configured tree lets the build step run."""
    c.configured = out.rc == 0
    return status_result(out.rc), "cmake -B %s Release (exit %d)" % (c.build_dir, out.rc)


def judge_build(c, out):
    """By the build's exit status, and FAIL without libvmmipc.so whatever the status (a build
    that exits 0 without it built nothing this check is about); the detail says whether the
    library and the cudart client were built (the build keeps going past a broken target)."""
    built = lambda path, test: "built" if test(c.path(path)) else "MISSING"
    result = status_result(out.rc) if os.path.isfile(c.lib) else FAIL
    return result, "exit %d; libvmmipc.so: %s, cudart_ipc_client: %s" % (
        out.rc, built(c.lib, os.path.isfile),
        built("{build_dir}/tests/gpu/cudart_ipc_client", lambda p: os.access(p, os.X_OK)))


def ctest_check_lines(c):
    """Passing tests print nothing in ctest's output: keep its full log, show the CHECK lines."""
    last = os.path.join(c.out, "ctest-gpu-LastTest.log")
    try:
        shutil.copyfile(c.path("{build_dir}/Testing/Temporary/LastTest.log"), last)
    except OSError:
        return []
    with open(last, encoding="utf-8", errors="replace") as handle:
        checks = [line.rstrip("\n") for line in handle if re.match(r"^(CHECK|RESULT|SKIP)", line)]
    return ["-- CHECK lines of the GPU clients (full output: %s) --" % last] + checks[:120]


def judge_ctest(c, out):
    """By ctest's exit status, but FAIL when a test line is neither Passed nor Skipped and SKIP
    when none passed; the counts and the first six tests that did not pass."""
    test = r" Test +#[0-9]+: "
    tests = [line for line in out.lines() if re.search(test, line)]
    passed = sum(1 for line in tests if re.search(r" Test +#[0-9]+: .* Passed ", line))
    skipped = sum(1 for line in tests if re.search(r"\*\*\*Skipped", line))
    failed = sum(1 for line in tests if not re.search(r" Passed |\*\*\*Skipped", line))
    shape = r".*Test +#[0-9]+: ([^ ]+) [ .]*(\*\*\*)?([A-Za-z][A-Za-z :]*[A-Za-z]).*"
    names = [re.sub(shape, r"\1=\3", line) for line in tests if " Passed " not in line][:6]
    result = status_result(out.rc)
    if result == PASS and failed:
        result = FAIL
    if result == PASS and not passed:
        result = SKIP
    names = ": " + " ".join(names) if names else ""
    return result, "%d passed, %d failed, %d skipped%s; exit %d" % (
        passed, failed, skipped, names, out.rc)


def ls_gpus(c):
    try:
        listing = sorted(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError as error:
        listing = ["ls: cannot access '/proc/driver/nvidia/gpus': " + error.strerror]
    return ["-- the host's GPU list (/proc/driver/nvidia/gpus) --"] + listing + [
        "-- vmmipc-run --check, no rank variable --"]


def judge_bench(c, out):
    """By run_bench.sh's exit status (a missed target is a result, not a failure): the medians
    in bench.json, the targets line of benchmarks.md, bench.png when drawn."""
    import json
    try:
        with open(os.path.join(c.out, "bench.json")) as handle:
            runs = json.load(handle).get("benchmarks", [])
        medians = sum(1 for r in runs if r.get("aggregate_name") == "median")
    except (OSError, ValueError, AttributeError):
        medians = 0
    targets = out.first(TARGETS, os.path.join(c.out, "benchmarks.md")) or "no report"
    png = ", bench.png" if os.path.isfile(os.path.join(c.out, "bench.png")) else ""
    return status_result(out.rc), (
        "%d medians, %d repetitions; targets: %s; benchmarks.md%s (exit %d)" % (
            medians, c.bench_reps, targets, png, out.rc))


def judge_floor(c, out):
    """By the probe's exit status; the vmm floor / legacy open ratios (RATIO lines)."""
    ratios = [re.sub(r"^RATIO ([a-z]+): .* = ", r"\1 ", line) for line in out.lines()
              if line.startswith("RATIO ")]
    ratios = ", ".join(",".join(ratios).split(",")) or "no RATIO lines"
    return status_result(out.rc), (
        "vmm floor / legacy open p50, N=2 one GPU: %s; floor.log (exit %d)" % (ratios, out.rc))


def judge_open_sequence(c, out):
    """By the probe's exit status; its SET_ACCESS summary (an empty stretch against an anchored
    one)."""
    lines = [line[len("SET_ACCESS "):] for line in out.lines() if line.startswith("SET_ACCESS ")]
    return status_result(out.rc), "%s; open-sequence.log (exit %d)" % (
        "; ".join(lines) or "no SET_ACCESS line", out.rc)


def judge_all_to_all(c, out):
    """By run_all_to_all.sh's exit status: FAIL only when a run crashed or saw wrong data; a
    missed target, or a run left out for the budget, is a result. The launcher runs and targets."""
    a2a = os.path.join(c.out, "all-to-all")
    runs = 0
    for _, _, files in os.walk(a2a):
        runs += sum(1 for f in files if re.fullmatch(r"all-to-all-n.*-g.*\.json", f))
    targets = out.first(TARGETS, os.path.join(a2a, "all-to-all.md")) or "no report"
    return status_result(out.rc), (
        "%d launcher runs; targets: %s; all-to-all/all-to-all.md (exit %d)" % (
            runs, targets, out.rc))


def judge_registration(c, out):
    """By run_registration.sh's exit status (FAIL only for wrong data or a crash); its SUMMARY
    lines: the fetch alone against its floor, K=64 x 2 MiB warm and cold against legacy."""
    lines = [line[len("SUMMARY "):] for line in out.lines() if line.startswith("SUMMARY ")]
    return status_result(out.rc), "%s; registration/registration.md (exit %d)" % (
        "; ".join(lines) or "no SUMMARY line", out.rc)


# --- the steps -------------------------------------------------------------------------------

LIBRARY_BUILT = Gate("libvmmipc.so built ({lib})", lambda c: os.path.isfile(c.lib), FAIL,
                     "not run: {lib} was not built")
HAS_NVIDIA_SMI = dict(when=lambda c: c.found("nvidia-smi"), when_doc="nvidia-smi on PATH")


def check_set(ctx):
    return CheckSet(
        title="vmmipc GPU check", budget_var="GPU_CHECK_BUDGET_S", budget_s=510, keep_s=15,
        min_step_s=5, skip_var="GPU_CHECK_SKIP",
        headline=lambda c, total: "%s, %s, commit %s, %ds; logs in %s" % (
            utc_minute(), c.gpu_line, c.commit, total, c.out),
        items=[
            Step("environment", banner="environment", log="env.log", judge=judge_env, run=[
                Note("date, host, repo and commit, output folder and budget", env_lines),
                Cmd(["nvidia-smi", "-L"], 30, **HAS_NVIDIA_SMI),
                Cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                     "--format=csv"], 30, **HAS_NVIDIA_SMI),
                Note("the GPU line: nvidia-smi --query-gpu=name,driver_version (not logged)",
                     gpu_line),
                Note("nvcc, cmake, ninja, g++ versions", tool_lines),
                Cmd(["python3", "-c", VERSIONS], 90),
                Note("libcuda.so.1 in ldconfig -p", libcuda_line)]),
            Step("configure", banner="configure", log="configure.log", judge=judge_configure,
                 run=[Cmd(["cmake", "-S", ".", "-B", "{build_dir}", "{generator}",
                           "-DCMAKE_BUILD_TYPE=Release"], 120)]),
            Step("build", banner="build", log="build.log", judge=judge_build,
                 gates=[Gate("configure passed", lambda c: c.configured, SKIP, "not configured")],
                 run=[Cmd(["cmake", "--build", "{build_dir}", "-j", "{nproc}", "{keep_going}"],
                          300)]),
            # The Python check (label python) runs in its own step, with its baseline.
            Step("ctest -L gpu", banner="ctest -L gpu", log="ctest-gpu.log", skip_key="ctest",
                 judge=judge_ctest,
                 gates=[Gate("a build tree ({build_dir}/CTestTestfile.cmake)",
                             lambda c: os.path.isfile(c.path("{build_dir}/CTestTestfile.cmake")),
                             SKIP, "no build tree")],
                 run=[Cmd(["ctest", "--test-dir", "{build_dir}", "-L", "gpu", "-LE", "python",
                           "--output-on-failure", "--timeout", "150", "--no-tests=error",
                           "--output-junit", "{out}/ctest-gpu.xml"], 240,
                          env={"VMMIPC_LOG_LEVEL": "info"}),
                      Note("ctest's LastTest.log kept as ctest-gpu-LastTest.log; its CHECK, "
                           "RESULT and SKIP lines shown (120)", ctest_check_lines)]),
            Step("python check", banner="python: torch / cuda.bindings / CuPy (+ baseline)",
                 log="python-check.log", skip_key="python", gates=[LIBRARY_BUILT],
                 judge=harness("torch_ipc_check"),
                 run=[Cmd(["python3", "tests/python/torch_ipc_check.py", "--deadline-s",
                           "{py_deadline}"], 360,
                          env={"LD_PRELOAD": "{lib}", "VMMIPC_LOG_LEVEL": "info",
                               "GPU_CHECK_BASELINE": "1"})]),
            # torch.multiprocessing spawn workers on one and two GPUs, with and without
            # CUDA_VISIBLE_DEVICES, two fresh runs each; slots from the GPU, peer pointers and
            # graph-baked pointers identical across runs.
            Step("spawn check", banner="spawn workers without a rank variable: slots from the GPU",
                 log="spawn-check.log", skip_key="spawn", gates=[LIBRARY_BUILT],
                 judge=harness("spawn_slot_check"),
                 run=[Note("the host's GPU list (/proc/driver/nvidia/gpus)", ls_gpus),
                      Cmd(["{launcher}", "--lib", "{lib}", "--check"], 60, unset=NO_RANK,
                          echo=False, keep=r"^\[.*\] (rank|GPU)|^VERDICT"),
                      Cmd(["python3", "tests/python/spawn_slot_check.py"], 300, unset=NO_RANK,
                          env={"LD_PRELOAD": "{lib}", "VMMIPC_LOG_LEVEL": "info"})]),
            # An exporter pauses VMM memory an importer has open (raw cuda.bindings in 2 MiB and
            # 32 MiB chunks, then torch_memory_saver.pause()): the free memory must go up; after
            # resume the importer reads the new bytes at the same pointer, directly and through a
            # graph captured before the pause. Each also once without VMMIPC_FOLLOW.
            Step("saver check",
                 banner="memory saver: importers follow an exporter's pause and resume",
                 log="saver-check.log", skip_key="saver", gates=[LIBRARY_BUILT],
                 judge=harness("memory_saver_check"),
                 run=[Cmd(["python3", "tests/python/memory_saver_check.py"], 240,
                          env={"LD_PRELOAD": "{lib}", "VMMIPC_LOG_LEVEL": "info",
                               "VMMIPC_FOLLOW": "1"})]),
            # run_bench.sh: with the preload (bench.json), without (bench-nopreload.json), briefly
            # at debug level for the phase timings (bench-debug.log); then benchmarks.md, bench.png.
            Step("benchmarks", banner="benchmarks", log="bench.log", skip_key="bench",
                 judge=judge_bench,
                 gates=[Gate("{bench} built", lambda c: os.access(c.path(c.bench), os.X_OK), FAIL,
                             "{bench} not built (Google Benchmark missing? see configure.log)"),
                        LIBRARY_BUILT],
                 remove=["{out}/bench.json", "{out}/bench-nopreload.json", "{out}/benchmarks.md",
                         "{out}/bench.png"],
                 run=[Cmd(["bash", "tests/bench/run_bench.sh", "--bench", "{bench}", "--lib",
                           "{lib}", "--out", "{out}", "--budget-s", "{bench_budget}",
                           "--repetitions", "{bench_reps}", "--scale", "{bench_scale}"], 200)]),
            # The driver's floor under concurrency, no vmmipc: N=2 processes on GPU 0 open 64 of
            # each other's 2 MiB chunks with every fd in hand, beside legacy IPC.
            Step("driver floor", banner="the driver's import floor under concurrency",
                 log="floor.log", skip_key="floor", judge=judge_floor,
                 gates=[Gate("cuda.bindings importable", lambda c: c.cuda_bindings(), SKIP,
                             "no cuda.bindings")],
                 run=[Cmd(["python3", "tests/bench/concurrent_import_floor.py", "--ranks", "2",
                           "--gpus", "1", "--per-rank", "64", "--reps", "3"], 90,
                          env={"LD_PRELOAD": ""})]),
            # One open's driver calls in variants: what the zone's page-table anchors save.
            Step("open sequence", log="open-sequence.log", skip_key="floor",
                 judge=judge_open_sequence, when=lambda c: c.cuda_bindings(),
                 when_doc="cuda.bindings importable (else the driver floor row says so)",
                 run=[Cmd(["python3", "tests/bench/open_sequence_probe.py", "--iters", "120"], 60,
                          env={"LD_PRELOAD": ""})]),
            # vmmipc's modes (the defaults, warm connections; ahead: runs mapped ahead) in
            # rotated all-to-all runs, N=2 and 4 on one GPU, legacy IPC and the driver's floor in
            # each; the fetch alone beside a bare round trip of one fd (run_registration.sh,
            # registration_report.py).
            Step("registration", banner="registration: vmmipc's modes, legacy and the floor",
                 log="registration.log", skip_key="registration", judge=judge_registration,
                 gates=[Gate("{a2a_bin} built", lambda c: os.access(c.path(c.a2a_bin), os.X_OK),
                             FAIL, "{a2a_bin} not built (see build.log)"),
                        LIBRARY_BUILT],
                 remove=["{out}/registration"],
                 run=[Cmd(["bash", "tests/bench/run_registration.sh", "--bin", "{a2a_bin}",
                           "--lib", "{lib}", "--fetch-bin", "{fetch_bin}", "--out",
                           "{out}/registration", "--ranks", "2 4", "--rounds", "2", "--reps", "2",
                           "--modes", "warm ahead", "--budget-s", "110"], 130)]),
            # NIXL's UCX backend, two processes on GPU 0: one-sided READ and WRITE of PyTorch
            # tensors with expandable segments, with and without vmmipc, with pidfd_getfd refused
            # by a seccomp filter, and cudaMalloc memory as the reference; every byte checked.
            Step("nixl check", banner="NIXL / UCX cuda_ipc on expandable segments",
                 log="nixl-check.log", skip_key="nixl", judge=harness("nixl_client_check"),
                 gates=[Gate("nixl installed or its wheel (NIXL_WHEEL, .whl/nixl_cu13-*.whl)",
                             lambda c: c.nixl(), SKIP, "not run: nixl wheel missing"),
                        LIBRARY_BUILT],
                 remove=["{out}/nixl"],
                 run=[Cmd(["python3", "tests/python/nixl_client_check.py", "--lib", "{lib}",
                           "--cases", "a,b,c,d,e", "--ucx", "{nixl_ucx}", "--out", "{out}/nixl",
                           "--json", "{out}/nixl/rows.json", "--budget-s", "{nixl_budget}"],
                          240, env={"LD_PRELOAD": ""})]),
            # UCX directly: ucx_perftest's GET and PUT between two processes on GPU 0, on VMM
            # memory (the vmm_cuda_malloc double) with and without vmmipc, pidfd_getfd allowed
            # and refused, cudaMalloc as the reference.
            Step("ucx perftest", banner="UCX's ucx_perftest on VMM memory",
                 log="ucx-perftest.log", skip_key="ucx", judge=harness("ucx_perftest_check"),
                 gates=[Gate("the libucx-cu13 wheel (UCX_WHEEL, .whl/libucx_cu13-*.whl)",
                             lambda c: c.ucx_wheel(), SKIP, "not run: libucx wheel missing"),
                        Gate("libvmm_cuda_malloc.so built",
                             lambda c: os.path.isfile(c.path(
                                 os.path.join(c.build_dir, "tests/gpu/libvmm_cuda_malloc.so"))),
                             FAIL, "{build_dir}/tests/gpu/libvmm_cuda_malloc.so not built"),
                        LIBRARY_BUILT],
                 remove=["{out}/ucx"],
                 run=[Cmd(["python3", "tests/python/ucx_perftest_check.py", "--lib", "{lib}",
                           "--shim", "{build_dir}/tests/gpu/libvmm_cuda_malloc.so", "--out",
                           "{out}/ucx", "--json", "{out}/ucx/rows.json"], 240,
                          env={"LD_PRELOAD": ""})]),
            Step("all-to-all", banner="all-to-all registration", log="all-to-all.log",
                 skip_key="all_to_all", judge=judge_all_to_all,
                 gates=[Gate("{a2a_bin} built", lambda c: os.access(c.path(c.a2a_bin), os.X_OK),
                             FAIL, "{a2a_bin} not built (see build.log)"),
                        LIBRARY_BUILT,
                        # Earlier steps spent the budget: too little left to say anything.
                        Gate("60 s of budget left", lambda c: c.a2a_limit >= 60, SKIP,
                             "only {a2a_limit}s of budget left; run it alone with "
                             "GPU_CHECK_SKIP=ctest,python,bench")],
                 remove=["{out}/all-to-all"],
                 run=[Cmd(["bash", "tests/bench/run_all_to_all.sh", "--bin", "{a2a_bin}", "--lib",
                           "{lib}", "--out", "{out}/all-to-all", "--budget-s", "{a2a_budget}",
                           "--reps", "{a2a_reps}"], ctx.a2a_want)]),
        ])
