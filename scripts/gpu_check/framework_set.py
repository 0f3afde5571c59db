"""The framework check (scripts/framework-check.sh): real framework clients of vmmipc on one
machine with two or more GPUs: vLLM's custom all-reduce kernels, DeepEP's intranode test and
SGLang's own VMM path. From the repository root:
  bash scripts/framework-check.sh [--lib PATH] [--vllm-src DIR [--vllm-ext SO]] [--deepep-src DIR
                                  [--deepep-build]] [--saver-wheel WHL] [--sglang-src DIR]
                                  [--out DIR] [--list | --dry-run]
(or the variables VMMIPC_LIB, VLLM_SRC, VLLM_EXT, DEEPEP_SRC, DEEPEP_BUILD=1, MEMORY_SAVER_WHEEL,
SGLANG_SRC, OUT). A framework whose source tree is not given is skipped, and says so.
--vllm-ext: an extension that an earlier run built from the same tree (its "vllm build" row
names it), to skip the compile. Relative paths are taken from the repository root.

vmmipc: --lib, else built here (cmake -S . -B $FRAMEWORK_CHECK_BUILD_DIR -G Ninja, Release,
target vmmipc; default build dir: build).
vLLM (VLLM_SRC: a vLLM source tree whose csrc/custom_all_reduce.cu has the fake_ipc_ptrs
interface, e.g. the 0.20.2 sdist): builds csrc/custom_all_reduce.cu and .cuh, nothing else,
as a torch extension (tests/frameworks/vllm_custom_ar.py build), then under torchrun, one rank
per GPU (2 ranks), drives them as vLLM's custom_all_reduce.py does:
  no-vmmipc   expandable segments, no preload: must fail as vllm#42609 (cudaIpcGetMemHandle
              on a captured input, "custom_all_reduce.cuh:<line> 'invalid argument'")
  vmmipc 1/2  expandable segments, vmmipc-run: eager + graph results bit-exact, latencies
  legacy 1/2  expandable segments off, no preload (legacy IPC): results, latencies
then: the graph buffers' pointers of vmmipc 1 and 2 (fresh runs) identical; the latency table
(8 KiB to 8 MiB, medians) of vmmipc against legacy, target within 3% (a miss is reported,
not failed).
DeepEP (DEEPEP_SRC: a DeepEP 1.x source tree, for tests/test_intranode.py; deep_ep itself must
be importable: built and installed per its README, or --deepep-build: built in place here,
intranode only, without NVSHMEM (tests/frameworks/deepep_build.py), in the background while the
library and the vLLM extension compile, waited for before anything is timed; v1.2.1 builds,
later 1.x commits do not link without NVSHMEM) with torch_memory_saver (installed, or
--saver-wheel WHL, default .whl/torch_memory_saver-*.whl, installed under the build dir): DeepEP's
intranode test on 2 GPUs with deep_ep.Buffer built inside torch_memory_saver.region() (preload
mode): must fail without vmmipc (cudaIpcGetMemHandle on the saver's VMM memory) and pass with
it (vmmipc-run --deepep, so the vmmipc.deepep hook sees the real DeepEP too).
SGLang (SGLANG_SRC: a folder holding sglang/srt/utils/cuda_vmm_utils.py, e.g. the unpacked
0.5.23 wheel): SGLang's own VMM path (FABRIC vote, POSIX fds over its sockets, import + map) and
legacy IPC on the same expandable-segment tensors, in one process (tests/frameworks/
sglang_vmm_path.py), without vmmipc (SGLang's path works, legacy IPC is refused) and with it
(both work: they coexist), with the two paths' registration times.

Every step runs under a timeout inside one budget (FRAMEWORK_CHECK_BUDGET_S, default 900).
Logs, JSON and summary.md go to the output folder (default $OUT, else
$FRAMEWORK_CHECK_BUILD_DIR/framework-report). Exit: 0 when no step failed, 1 when one did,
2 when nothing could run (fewer than 2 GPUs, or no source tree given). $PYTHON (python3) runs
the harnesses; NCCL_NVLS_ENABLE is 0 unless set (the checks need no NVLink multicast).
"""

import glob
import os

from .engine import Context, described_commit, utc_minute
from .steps import (FAIL, LAUNCHER, MISSED, PASS, SKIP, Banner, CheckSet, Cmd, Gate, Group, Note,
                    Step, Wait, by_status, status_result)

VERSIONS = '''
import importlib
for name in ("torch", "torch_memory_saver", "deep_ep", "vllm"):
    try:
        module = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = " (CUDA %s, %d GPUs)" % (module.version.cuda, module.cuda.device_count())
        print(name, getattr(module, "__version__", "?") + extra, getattr(module, "__file__", ""))
    except Exception as error:
        print(name, "not importable (%s: %s)" % (type(error).__name__, error))
'''
MISSING = '''
import importlib
for name in ("deep_ep", "torch_memory_saver"):
    try:
        importlib.import_module(name)
    except Exception as error:
        print("%s (%s)" % (name, type(error).__name__), end=" ")
'''
SAVER_PRELOAD = '''from torch_memory_saver.utils import get_binary_path_from_package as find
print(find("torch_memory_saver_hook_mode_preload"))'''
EXPORTING = r"\] info: vmmipc .* exporting"


def in_repo(repo, path):
    return os.path.normpath(os.path.join(repo, path)) if path else path


class FrameworkContext(Context):
    def __init__(self, repo, out, env, args, dry_run=False):
        env = dict(env)
        env.setdefault("NCCL_NVLS_ENABLE", "0")  # keep NCCL (DeepEP's process group) off NVLS
        env["PYTHONUNBUFFERED"] = "1"
        super().__init__(repo, out, env, dry_run)
        self.python = env.get("PYTHON") or "python3"
        self.build_dir = env.get("FRAMEWORK_CHECK_BUILD_DIR") or "build"
        self.harness = os.path.join(repo, "tests", "frameworks")
        self.launcher = os.path.join(repo, LAUNCHER)
        self.torchrun = [self.python, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "2"]
        self.vllm_src, self.deepep_src, self.sglang_src = (
            args.vllm_src, args.deepep_src, args.sglang_src)
        self.deepep_build = args.deepep_build
        self.lib_given, self.vllm_ext_given = args.lib, args.vllm_ext
        if args.lib:
            lib = in_repo(repo, args.lib)
            self.lib = lib if os.path.isfile(lib) or dry_run else ""
        else:
            self.lib = os.path.join(repo, self.build_dir, "csrc", "libvmmipc.so")
        self.vllm_ext = in_repo(repo, args.vllm_ext) if args.vllm_ext else None
        wheels = sorted(glob.glob(os.path.join(repo, ".whl", "torch_memory_saver-*.whl")))
        self.saver_wheel = args.saver_wheel or (wheels[0] if wheels else None)
        self.saver_target = os.path.join(repo, self.build_dir, "frameworks", "site")
        # LD_PRELOAD without any libvmmipc.so, for the runs without vmmipc.
        entries = env.get("LD_PRELOAD", "").replace(" ", ":").split(":")
        self.preload = ":".join(e for e in entries if e and
                                not os.path.basename(e).startswith("libvmmipc"))
        self.deepep_preload = None  # the saver's preload hook first (the DeepEP group's setup)
        self.deepep_missing = None  # set by the DeepEP group's gate
        self.gpus = None if dry_run else 0  # counted by the environment step
        self.gpu_line = "no GPU"

    @property
    def generator(self):
        return [] if os.path.isfile(os.path.join(self.repo, self.build_dir, "CMakeCache.txt")) \
            else ["-G", "Ninja"]

    @property
    def lib_or_none(self):
        return self.lib or "none"

    def _jsons(self, kind):
        paths = [os.path.join(self.out, "vllm-%s-%d.json" % (kind, n)) for n in (1, 2)]
        return paths if self.dry_run else [p for p in paths if os.path.isfile(p)]

    @property
    def vmmipc_jsons(self):
        return self._jsons("vmmipc")

    @property
    def legacy_jsons(self):
        return self._jsons("legacy")

    def modules_missing(self):
        self.deepep_missing = self.probe([self.python, "-c", MISSING])[1]
        return self.deepep_missing


# --- notes, conditions, judges ---------------------------------------------------------------


def env_lines(c):
    import time
    return ["date -u: " + time.strftime("%a %b %e %H:%M:%S UTC %Y", time.gmtime()),
            "host: " + c.probe(["uname", "-a"])[1].strip(),
            "repo: %s, commit %s" % (c.repo, described_commit(c.repo)),
            "vllm source: %s; deepep source: %s" % (c.vllm_src or "not given",
                                                    c.deepep_src or "not given")]


def count_gpus(c):
    if c.found("nvidia-smi"):
        rows = c.probe(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], 20)[1]
        c.gpus = sum(1 for line in rows.splitlines() if line.strip().isdigit())
        rows = c.probe(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       20)[1]
        c.gpu_line = next((line for line in rows.splitlines() if "," in line), "") or "no GPU"
    return []


def judge_env(c, out):
    """PASS with 2 GPUs or more; SKIP with fewer (nothing below runs)."""
    if c.gpus >= 2:
        return PASS, "%d GPUs: %s" % (c.gpus, c.gpu_line or "?")
    return SKIP, "%d GPUs visible: these checks need 2; nothing below runs" % c.gpus


def needs_saver_wheel(c):
    if c.probe([c.python, "-c", "import torch_memory_saver"])[0] == 0:
        return False
    return bool(c.saver_wheel)  # without one, the DeepEP row says what is missing


def judge_saver_wheel(c, out):
    """By pip's exit status; on success the target folder goes on PYTHONPATH."""
    if out.rc == 0:
        c.env["PYTHONPATH"] = ":".join(p for p in (c.saver_target, c.env.get("PYTHONPATH")) if p)
        return PASS, "%s into %s" % (os.path.basename(c.saver_wheel), c.saver_target)
    return FAIL, "pip install --target of %s: exit %d (saver-wheel.log)" % (c.saver_wheel, out.rc)


def judge_deepep_build(c, out):
    """PASS when the build exited 0 and printed BUILT <folder>, which goes on PYTHONPATH."""
    built = out.first(r"^BUILT .*")[len("BUILT "):]
    if out.rc == 0 and built:
        c.env["PYTHONPATH"] = ":".join(p for p in (built, c.env.get("PYTHONPATH")) if p)
        return PASS, "intranode only, no NVSHMEM, in place: " + built
    return status_result(out.rc), "%s (exit %d; deepep-build.log)" % (
        out.first(r"^ERROR.*")[:160], out.rc)


def judge_library(c, out):
    """PASS when cmake configured and built the target vmmipc and libvmmipc.so is there."""
    if out.rc == 0 and os.path.isfile(c.lib):
        return PASS, "built: " + c.lib
    c.lib = ""
    return status_result(out.rc), "cmake configure/build failed (exit %d; library.log)" % out.rc


def judge_given_ext(c, out):
    """PASS: the extension an earlier run built."""
    return PASS, "given: %s (built earlier from %s)" % (c.vllm_ext, c.vllm_src)


def judge_vllm_build(c, out):
    """PASS when the harness printed BUILT <extension>; the vLLM runs need it."""
    ext = out.first(r"^BUILT .*")[len("BUILT "):]
    if out.rc != 0 or not ext:
        return status_result(out.rc) if out.rc else FAIL, (
            "csrc/custom_all_reduce.cu did not build (exit %d; vllm-build.log)" % out.rc)
    c.vllm_ext = ext
    return PASS, "%s from %s/csrc/custom_all_reduce.cu" % (ext, c.vllm_src)


def judge_vllm_without(c, out):
    """PASS when the run failed as vllm#42609 (custom_all_reduce.cuh:<line> 'invalid argument'
    in get_graph_buffer_ipc_meta); anything else is a FAIL."""
    line = out.first(r"Failed: Cuda error [^ ]*custom_all_reduce\.cuh:[0-9]+ 'invalid argument'")
    if out.rc != 0 and line:
        where = out.first(r"STEP rank[0-9]+ get_graph[^ ]*").split(" ")[2:3]
        eager = out.count(r"^CHECK rank[0-9]+ vllm\.eager\.[^ ]+ PASS")
        return PASS, "failed as vllm#42609: %s at %s (exit %d; eager checks before it: %d PASS)" % (
            line.rsplit("/", 1)[-1], "".join(where), out.rc, eager)
    return FAIL, ("expected the vllm#42609 failure, got exit %d and no such line "
                  "(vllm-no-vmmipc.log)" % out.rc)


def judge_vllm_run(with_vmmipc):
    def judge(c, out):
        summary = out.first(r"^SUMMARY vllm_custom_ar: .*").split(" ", 2)[2:]
        exports = "; vmmipc exporting lines: %d" % out.count(EXPORTING) if with_vmmipc else ""
        return status_result(out.rc), "%s%s; exit %d" % (
            "".join(summary) or "no SUMMARY line", exports, out.rc)

    judge.__doc__ = "By the exit status; the harness's SUMMARY line%s." % (
        " and the vmmipc exporting lines" if with_vmmipc else "")
    return judge


def judge_pointers(c, out):
    """By the compare's exit status (POINTERS IDENTICAL or DIFFERENT)."""
    word = out.first(r"^POINTERS [A-Z]+")[len("POINTERS "):]
    entries = out.first(r"rank 0 graph_peer_ptrs: [0-9]+ entries").split(" ")[3:4]
    return status_result(out.rc), "%s in two fresh vmmipc runs: %s graph buffers a rank" % (
        word, "".join(entries))


def judge_latency(c, out):
    """PASS when every size is within 3% of legacy IPC (LATENCY ... 0 outside), else MISSED
    (a result, not a failure)."""
    line = out.first(r"^LATENCY .*", os.path.join(c.out, "vllm-latency.md"))
    detail = "%s; vllm-latency.md" % line[len("LATENCY "):]
    return (PASS if " 0 outside" in line else MISSED), detail


def judge_sglang(with_vmmipc):
    def judge(c, out):
        summary = "; ".join(s.split(" ", 3)[3] for s in
                            out.every(r"^SUMMARY rank0 sglang_vmm_path: .*")) or "no SUMMARY line"
        if not with_vmmipc:
            return status_result(out.rc), (
                "SGLang's path reads the peer's tensors, legacy IPC refused: %s (rank 0); "
                "exit %d" % (summary, out.rc))
        measure = out.first(r"^MEASURE rank0 .*").split(" ", 2)[2:]
        return status_result(out.rc), (
            "both paths read the peer's tensors: %s (rank 0); %s; exit %d" % (
                summary, "".join(measure) or "no MEASURE line", out.rc))

    judge.__doc__ = "By the exit status; the rank 0 SUMMARY line%s." % (
        " and its MEASURE line" if with_vmmipc else "")
    return judge


def deepep_setup(c):
    saver = c.probe([c.python, "-c", SAVER_PRELOAD])[1].strip()
    c.deepep_preload = ":".join(p for p in (saver, c.preload) if p)


def judge_deepep_without(c, out):
    """PASS when the run failed with 'invalid argument' (cudaIpcGetMemHandle on the saver's VMM
    memory); anything else is a FAIL."""
    line = out.first(r"[^ ]*deep_ep\.cpp:[0-9]+ '[^']*'")
    if out.rc != 0 and out.count("invalid argument"):
        return PASS, "failed in the memory saver's region: %s (exit %d)" % (
            line or "invalid argument", out.rc)
    return FAIL, "expected cudaIpcGetMemHandle to fail, got exit %d (deepep-no-vmmipc.log)" % out.rc


def judge_deepep_with(c, out):
    """PASS when the test exited 0 with its RESULT line; FAIL when it exited 0 without it (it
    did not run its loop to the end); else by the exit status; the vmmipc exporting lines and
    the vmmipc.deepep hook's line."""
    hook = out.first(r"deep_ep\.Buffer: .*")[:90] or "no line"
    if out.rc == 0 and out.count(r"^RESULT deepep_intranode"):
        return PASS, ("DeepEP's test_intranode checks passed on 2 ranks; vmmipc exporting lines: "
                      "%d; hook: %s" % (out.count(EXPORTING), hook))
    if out.rc == 0:
        return FAIL, "exited 0 without its RESULT line (deepep-vmmipc.log); hook: %s" % hook
    return status_result(out.rc), "exit %d (deepep-vmmipc.log); hook: %s" % (out.rc, hook)


def latency_table(c):
    path = os.path.join(c.out, "vllm-latency.md")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as handle:
        table = [line.rstrip("\n") for line in handle if line.startswith("|")]
    return ["", "vLLM custom all-reduce, graph replay, bf16, per all-reduce:", ""] + table


# --- the steps -------------------------------------------------------------------------------

TWO_GPUS = Gate("2 GPUs and libvmmipc.so", lambda c: c.gpus >= 2 and bool(c.lib), SKIP,
                "needs 2 GPUs ({gpus} seen) and libvmmipc.so ({lib_or_none})")
EXPANDABLE = "expandable_segments:True"
HAS_NVIDIA_SMI = dict(when=lambda c: c.found("nvidia-smi"), when_doc="nvidia-smi on PATH")


def vllm_run(name):
    """vmmipc-N under vmmipc-run, legacy-N without the preload, expandable segments off."""
    json = "{out}/vllm-%s.json" % name
    harness = ["{torchrun}", "{harness}/vllm_custom_ar.py", "run", "--ext", "{vllm_ext}", "--out",
               json, "--latency"]
    if name.startswith("vmmipc"):
        cmd = Cmd(["{launcher}", "--lib", "{lib}", "--log-level", "info", "--"] + harness, 240,
                  env={"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE})
    else:
        cmd = Cmd(harness, 240, env={"LD_PRELOAD": "{preload}",
                                     "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    return Step("vllm " + name, log="vllm-%s.log" % name, remove=[json], run=[cmd],
                judge=judge_vllm_run(name.startswith("vmmipc")))


def check_set(ctx):
    sglang = ["{torchrun}", "{harness}/sglang_vmm_path.py", "--sglang-src", "{sglang_src}"]
    deepep = ["{harness}/deepep_intranode.py", "--deepep-src", "{deepep_src}", "--memory-saver",
              "--num-processes", "2"]
    return CheckSet(
        title="vmmipc framework check", budget_var="FRAMEWORK_CHECK_BUDGET_S", budget_s=900,
        keep_s=20, min_step_s=10, nothing_ran_code=2, appendix=latency_table,
        headline=lambda c, total: "%s, %s, %d GPUs, %ds; logs in %s" % (
            utc_minute(), c.gpu_line, c.gpus, total, c.out),
        items=[
            Step("environment", banner="environment", log="env.log", judge=judge_env,
                 remove=["{out}/vllm-latency.md"],  # the summary shows this run's table only
                 run=[Note("date, host, repo and commit, the source trees given", env_lines),
                      Cmd(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total",
                           "--format=csv"], 30, **HAS_NVIDIA_SMI),
                      Cmd(["nvidia-smi", "topo", "-m"], 30, **HAS_NVIDIA_SMI),
                      Note("the GPU count and line: nvidia-smi --query-gpu (not logged)",
                           count_gpus),
                      Cmd(["{python}", "-c", VERSIONS], 60)]),
            # torch_memory_saver from a wheel when it is not installed: into the build dir.
            Step("saver wheel", log="saver-wheel.log", judge=judge_saver_wheel,
                 when=needs_saver_wheel, when_doc="torch_memory_saver not importable and a wheel "
                 "(--saver-wheel, MEMORY_SAVER_WHEEL or .whl/torch_memory_saver-*.whl)",
                 run=[Cmd(["{python}", "-m", "pip", "install", "--no-deps", "--no-index",
                           "--disable-pip-version-check", "--quiet", "--upgrade", "--target",
                           "{saver_target}", "{saver_wheel}"], 120)]),
            # CPU only: builds while the library and the vLLM extension compile; collected
            # before anything is timed.
            Step("deepep build", log="deepep-build.log", background=True, judge=judge_deepep_build,
                 when=lambda c: bool(c.deepep_build and c.deepep_src and c.gpus >= 2),
                 when_doc="--deepep-build, a DeepEP tree and 2 GPUs",
                 run=[Cmd(["{python}", "{harness}/deepep_build.py", "--deepep-src", "{deepep_src}"],
                          480)]),
            Step("library", banner="libvmmipc.so", log="library.log",
                 judge=by_status("given: {lib}"), when=lambda c: bool(c.lib_given),
                 when_doc="--lib given",
                 gates=[Gate("the --lib file exists", lambda c: bool(c.lib), FAIL,
                             "--lib {lib_given}: no such file")]),
            Step("library", banner="libvmmipc.so", log="library.log", judge=judge_library,
                 when=lambda c: not c.lib_given, when_doc="no --lib",
                 run=[Cmd(["cmake", "-S", ".", "-B", "{build_dir}", "{generator}",
                           "-DCMAKE_BUILD_TYPE=Release"], 180),
                      Cmd(["cmake", "--build", "{build_dir}", "--target", "vmmipc"], 400,
                          only_if_ok=True)]),
            Banner("vLLM custom all-reduce"),
            Group("vllm", gates=[
                Gate("a vLLM source tree", lambda c: bool(c.vllm_src), SKIP,
                     "no vLLM source tree (--vllm-src or VLLM_SRC)"), TWO_GPUS], items=[
                Step("vllm build", judge=judge_given_ext, required=True,
                     when=lambda c: bool(c.vllm_ext_given), when_doc="--vllm-ext given",
                     gates=[Gate("the --vllm-ext file exists",
                                 lambda c: os.path.isfile(c.vllm_ext), FAIL,
                                 "--vllm-ext {vllm_ext_given}: no such file")]),
                Step("vllm build", log="vllm-build.log", judge=judge_vllm_build, required=True,
                     when=lambda c: not c.vllm_ext_given, when_doc="no --vllm-ext",
                     run=[Cmd(["{python}", "{harness}/vllm_custom_ar.py", "build", "--vllm-src",
                               "{vllm_src}", "--build-dir",
                               "{build_dir}/frameworks/vllm_custom_ar"], 420)]),
                Wait("deepep build"),  # nothing below competes with a compile
                Step("vllm without vmmipc", log="vllm-no-vmmipc.log", judge=judge_vllm_without,
                     run=[Cmd(["{torchrun}", "{harness}/vllm_custom_ar.py", "run", "--ext",
                               "{vllm_ext}", "--out", "{out}/vllm-no-vmmipc.json"], 180,
                              env={"LD_PRELOAD": "{preload}",
                                   "PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE})]),
                # Twice fresh each, interleaved so that drift hits both.
                vllm_run("vmmipc-1"), vllm_run("legacy-1"), vllm_run("vmmipc-2"),
                vllm_run("legacy-2"),
                Step("vllm pointers", log="vllm-compare.log", judge=judge_pointers,
                     gates=[Gate("both vmmipc runs wrote JSON",
                                 lambda c: len(c.vmmipc_jsons) == 2, FAIL,
                                 "a vmmipc run wrote no JSON")],
                     run=[Cmd(["{python}", "{harness}/vllm_custom_ar.py", "compare", "--pointers",
                               "{out}/vllm-vmmipc-1.json", "{out}/vllm-vmmipc-2.json"], 60)]),
                Step("vllm latency", log="vllm-compare.log", append=True, judge=judge_latency,
                     gates=[Gate("a vmmipc and a legacy JSON",
                                 lambda c: bool(c.vmmipc_jsons and c.legacy_jsons), FAIL,
                                 "no latency JSON from vmmipc and legacy runs")],
                     run=[Cmd(["{python}", "{harness}/vllm_custom_ar.py", "compare", "--vmmipc",
                               "{vmmipc_jsons}", "--legacy", "{legacy_jsons}"], 60,
                              copy_to="{out}/vllm-latency.md")])]),
            Banner("SGLang's VMM path beside vmmipc"),
            Group("sglang", gates=[
                Gate("an SGLang tree", lambda c: bool(c.sglang_src), SKIP,
                     "no SGLang tree (--sglang-src or SGLANG_SRC)"),
                Gate("a GPU and libvmmipc.so", lambda c: c.gpus >= 1 and bool(c.lib), SKIP,
                     "needs a GPU and libvmmipc.so ({lib_or_none})")], items=[
                Wait("deepep build"),
                Step("sglang without vmmipc", log="sglang-no-vmmipc.log", judge=judge_sglang(False),
                     run=[Cmd(sglang, 180, env={"LD_PRELOAD": "{preload}",
                                                "PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE})]),
                Step("sglang with vmmipc", log="sglang-vmmipc.log", judge=judge_sglang(True),
                     run=[Cmd(["{launcher}", "--lib", "{lib}", "--log-level", "info", "--"]
                              + sglang, 180, env={"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE})])]),
            Banner("DeepEP intranode, Buffer in a torch_memory_saver region"),
            Wait("deepep build"),
            Group("deepep", setup=deepep_setup,
                  setup_doc="deepep_preload: torch_memory_saver's preload hook, then LD_PRELOAD "
                  "without libvmmipc", gates=[
                      Gate("a DeepEP source tree", lambda c: bool(c.deepep_src), SKIP,
                           "no DeepEP source tree (--deepep-src or DEEPEP_SRC)"), TWO_GPUS,
                      Gate("deep_ep and torch_memory_saver importable",
                           lambda c: not c.modules_missing(), SKIP,
                           "not importable: {deepep_missing}(build and install DeepEP per its "
                           "README; pip install torch_memory_saver)")], items=[
                Step("deepep without vmmipc", log="deepep-no-vmmipc.log",
                     judge=judge_deepep_without,
                     run=[Cmd(["{python}"] + deepep, 240, env={"LD_PRELOAD": "{deepep_preload}"})]),
                Step("deepep with vmmipc", log="deepep-vmmipc.log", judge=judge_deepep_with,
                     run=[Cmd(["{launcher}", "--lib", "{lib}", "--deepep", "--log-level", "info",
                               "--", "{python}"] + deepep, 360,
                              env={"LD_PRELOAD": "{deepep_preload}"})])]),
        ])
