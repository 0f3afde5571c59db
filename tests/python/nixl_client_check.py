#!/usr/bin/env python3
"""NIXL's UCX backend as a vmmipc client: one-sided READ and WRITE between two processes on one
GPU, on PyTorch memory, with and without vmmipc, with pidfd_getfd refused (issue 38).

NIXL (nixl-cu13, its own Python API) moves KV-cache blocks between the processes of one host
through UCX; UCX's cuda_ipc transport registers device memory with cuIpcGetMemHandle when
cuPointerGetAttributes says IS_LEGACY_CUDA_IPC_CAPABLE, which the driver answers 0 for VMM memory
(PyTorch's expandable segments) and vmmipc answers 1 for VMM memory it can export. Each case is a
TARGET process (registers its tensors, publishes NIXL metadata) and an INITIATOR (reads the
target's tensors into its own, then writes its own into the target's), started fresh:

  zero-*  step zero: cudaMalloc memory (expandable segments off), no vmmipc, under each UCX
          setting of --sweep: which settings carry it over cuda_ipc on one GPU
  a       PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, no vmmipc
  b       as a, libvmmipc.so preloaded in both (VMMIPC_RANK 0 and 1, VMMIPC_STATS=1)
  c       as a, both started by pidfd_seccomp.py: pidfd_getfd answers EPERM
  d       as b under the same filter
  e       cudaMalloc memory (expandable segments off), no vmmipc: the reference lane
Cases a-e run under --ucx when given, else under the UCX setting step zero chose (the fastest
one whose transfers all had every byte right), else under UCX's defaults.

Tensors (uint8): "big", --mib MiB (default 512), allocated first; "multi", --multi-mib MiB
(default 72), allocated after it, so that with expandable segments it starts inside a segment
chunk and spans several. Every MiB of each holds a different pattern. Each op and tensor: one
warm-up transfer and --reps timed ones (median reported), each timed from NIXL's transfer() to
check_xfer_state() == DONE. READ: the initiator's tensor is set to the complement of the
target's pattern before each transfer and every byte checked after it. WRITE: the target sets
its tensor to the complement of the initiator's pattern before each transfer and checks every
byte after it (a file handshake between the two, outside the timed part).

The lane: UCX_PROTO_INFO=y and UCX_LOG_LEVEL=info in both processes; the transports named in the
PROTO_INFO tables of remote reads and writes are the lane (cuda_ipc, tcp, ...). Each case's
logs are kept in --out.

nixl: imported if installed (nixl_cu13, else nixl); else the wheel (--wheel, $NIXL_WHEEL, else
<repo>/.whl/nixl_cu13-*.whl or nixl-*.whl) is installed into a temporary folder (pip --no-deps
--no-index --target; unzip when pip fails).

Checks: each case ran (4 transfers complete, both exit 0) and had every byte right; with vmmipc
(b, d) the lane of READ and WRITE is the reference's (e). A slow lane without vmmipc is a
result, not a failure. Prints CHECK <name> PASS|FAIL|SKIP, INFO and ROW lines, a markdown table, and
`SUMMARY nixl_client_check: N PASS, M FAIL, K SKIP`; --json FILE writes the rows. Exit 0 when no
check failed, 1 when one did, 77 (a SKIPPED: line) when nothing could run here: no nixl and no
wheel, no torch, no GPU.
"""
import argparse
import base64
import glob
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LAUNCHER = os.path.join(HERE, "pidfd_seccomp.py")
SKIP = 77
MIB = 1 << 20
CASES = ("a", "b", "c", "d", "e")
CASE_TEXT = {
    "a": "expandable segments, no vmmipc",
    "b": "expandable segments, vmmipc",
    "c": "expandable segments, no vmmipc, pidfd_getfd refused",
    "d": "expandable segments, vmmipc, pidfd_getfd refused",
    "e": "cudaMalloc (reference), no vmmipc",
}
# Step zero: name -> UCX variables. NIXL's UCX backend needs a transport that can wire up and
# handle peer failure (tcp) besides cuda_ipc: UCX_TLS=cuda_ipc,cuda_copy,self,sm does not connect.
SWEEP = {
    "defaults": {},
    "get_zcopy_on": {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "on"},
    "tls_ipc_tcp": {"UCX_TLS": "cuda_ipc,cuda_copy,tcp"},
    "tls_ipc_tcp_get_on": {"UCX_TLS": "cuda_ipc,cuda_copy,tcp",
                           "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "on"},
}
# A PROTO_INFO table's first line: "| <context name> <scope> cfg#N |".
PROTO_HEAD = re.compile(r"\|\s*\S+\s+(intra-node|inter-node|self)\s+cfg#\d+\s*\|\s*$")


# --- patterns --------------------------------------------------------------------------------

def pattern_values(torch, start, end, salt, device):
    i = torch.arange(start, end, device=device, dtype=torch.int64)
    return (i * 13 + (i >> 12) * 7 + (i >> 20) * 31 + salt * 101) & 0xFF


def where_from(torch, tensor, first, salt, complement_was):
    """For wrong bytes at `first`: "untouched" when they still hold the complement the check
    set before the transfer, "shifted by N MiB" when they hold the expected pattern of offset
    first+N (N in -64..64), else "unknown"."""
    end = min(tensor.numel(), first + 4096)
    got = tensor[first:end].to(torch.int64)
    if complement_was is not None and bool((got == (pattern_values(
            torch, first, end, complement_was, tensor.device) ^ 0xFF)).all().item()):
        return "untouched"
    for mib in range(-64, 65):
        start = first + mib * MIB
        if mib == 0 or start < 0:
            continue
        if bool((got == pattern_values(torch, start, start + end - first, salt,
                                       tensor.device)).all().item()):
            return "shifted by %+d MiB" % mib
    return "unknown"


def fill_pattern(torch, tensor, salt):
    """Byte i of the tensor: a function of i, of its MiB index and of `salt` (every MiB of every
    tensor differs). Made on the GPU, 64 MiB at a time."""
    step = 64 * MIB
    n = tensor.numel()
    for start in range(0, n, step):
        end = min(n, start + step)
        tensor[start:end].copy_(pattern_values(torch, start, end, salt, tensor.device).to(
            torch.uint8))


def count_wrong(torch, tensor, salt, complement=False):
    """(bytes checked, bytes wrong, first wrong offset or -1): every byte against the pattern."""
    step = 64 * MIB
    n = tensor.numel()
    wrong, first = 0, -1
    for start in range(0, n, step):
        end = min(n, start + step)
        values = pattern_values(torch, start, end, salt, tensor.device)
        if complement:
            values = values ^ 0xFF
        bad = tensor[start:end].to(torch.int64) != values
        count = int(bad.sum().item())
        if count and first < 0:
            first = start + int(bad.nonzero()[0].item())
        wrong += count
    return n, wrong, first


# --- the two processes -------------------------------------------------------------------------

def import_nixl():
    for name in ("nixl_cu13", "nixl._api", "nixl"):
        try:
            module = __import__(name, fromlist=["nixl_agent"])
            if hasattr(module, "nixl_agent"):
                return module, name
        except ImportError:
            continue
    raise ImportError("no nixl_cu13 or nixl module")


def nixl_version():
    try:
        from importlib import metadata
        for dist in ("nixl-cu13", "nixl-cu12", "nixl"):
            try:
                return "%s %s" % (dist, metadata.version(dist))
            except metadata.PackageNotFoundError:
                continue
    except ImportError:
        pass
    return "nixl ?"


def wait_for(path, deadline, what, abort=None):
    """Waits for a file another process writes (atomically, by rename), with a bound; gives up
    at once when the file `abort` appears (the other side has ended)."""
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError("no %s (%s) before the deadline" % (what, path))
        if abort and os.path.exists(abort):
            raise RuntimeError("no %s: the other side ended (%s)" % (what, abort))
        time.sleep(0.001)
    with open(path) as handle:
        return handle.read()


def put(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def describe_memory(tensor):
    """What UCX's cuda_ipc asks the driver about the tensor (through vmmipc when preloaded)."""
    try:
        return _describe_memory(tensor)
    except Exception as exc:  # a diagnostic only
        return "cannot describe: %s: %s" % (type(exc).__name__, exc)


def _describe_memory(tensor):
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu
        except ImportError:
            return "cuda.bindings missing"
    ptr = tensor.data_ptr()
    ok = cu.CUresult.CUDA_SUCCESS
    out = []
    err, legacy = cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr)
    out.append("legacy_ipc_capable=%s" % (int(legacy) if err == ok else err.name))
    err, types = cu.cuPointerGetAttribute(
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, ptr)
    out.append("allowed_handle_types=%s" % (hex(int(types)) if err == ok else err.name))
    err, base, size = cu.cuMemGetAddressRange(ptr)
    if err == ok:
        out.append("cuMemGetAddressRange=0x%x+%d MiB (ptr at +%d KiB)" % (
            int(base), int(size) // MIB, (ptr - int(base)) // 1024))
    else:
        out.append("cuMemGetAddressRange=%s" % err.name)
    return " ".join(out)


def worker(opts):
    """One side of a case. Prints INFO lines; the initiator writes the results file."""
    from pidfd_seccomp import probe
    rdv = opts.rendezvous
    deadline = time.monotonic() + opts.deadline_s
    role = opts.role
    print("INFO %s pid %d: pidfd_getfd on itself: %s; LD_PRELOAD=%s; PYTORCH_CUDA_ALLOC_CONF=%s" % (
        role, os.getpid(), probe(), os.environ.get("LD_PRELOAD", ""),
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")), flush=True)
    import torch
    nixl, module_name = import_nixl()
    torch.cuda.set_device(0)
    sizes = {"big": int(opts.mib * MIB), "multi": int(opts.multi_mib * MIB)}
    tensors = {name: torch.empty(size, dtype=torch.uint8, device="cuda")
               for name, size in sizes.items()}
    salt = {"target": {"big": 1, "multi": 2}, "initiator": {"big": 3, "multi": 4}}
    for name, tensor in tensors.items():
        fill_pattern(torch, tensor, salt[role][name])
        print("INFO %s %s: %g MiB at 0x%x: %s" % (role, name, tensor.numel() / MIB,
                                                 tensor.data_ptr(), describe_memory(tensor)),
              flush=True)
    torch.cuda.synchronize()
    agent = nixl.nixl_agent(role, nixl.nixl_agent_config(backends=["UCX"]))
    print("INFO %s: %s from %s (%s), torch %s" % (role, nixl_version(), module_name,
                                                 os.path.dirname(nixl.__file__),
                                                 torch.__version__), flush=True)
    names = list(sizes)
    reg = agent.register_memory([tensors[n] for n in names])
    if role == "target":
        try:
            return target(opts, torch, agent, tensors, names, salt, rdv, deadline, reg)
        finally:
            put(os.path.join(rdv, "target-ended"), "")
    return initiator(opts, torch, agent, tensors, names, salt, rdv, deadline, reg)


def target(opts, torch, agent, tensors, names, salt, rdv, deadline, reg):
    put(os.path.join(rdv, "target.json"), json.dumps({
        "metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
        "descs": {n: [tensors[n].data_ptr(), tensors[n].numel(), 0] for n in names}}))
    bye = os.path.join(rdv, "bye")
    # WRITE: before each transfer, the complement of the initiator's pattern; after, every byte.
    k = 0
    while True:
        text = wait_for(os.path.join(rdv, "want-%d" % k), deadline, "write step %d" % k, bye)
        if text == "end":
            break
        name = text
        tensor = tensors[name]
        fill_pattern(torch, tensor, salt["initiator"][name])
        tensor.bitwise_xor_(0xFF)
        torch.cuda.synchronize()
        put(os.path.join(rdv, "ready-%d" % k), "")
        wait_for(os.path.join(rdv, "wrote-%d" % k), deadline, "write %d done" % k, bye)
        checked, wrong, first = count_wrong(torch, tensor, salt["initiator"][name])
        how = where_from(torch, tensor, first, salt["initiator"][name],
                         salt["initiator"][name]) if wrong else ""
        put(os.path.join(rdv, "checked-%d" % k), json.dumps([checked, wrong, first, how]))
        k += 1
    wait_for(bye, deadline, "the initiator's end")
    agent.deregister_memory(reg)
    print("INFO target: done", flush=True)
    return 0


def timed(agent, handle, deadline):
    """(seconds, state) of one transfer, from transfer() to DONE."""
    start = time.perf_counter()
    state = agent.transfer(handle)
    while state == "PROC":
        if time.monotonic() > deadline:
            return time.perf_counter() - start, "TIMEOUT"
        state = agent.check_xfer_state(handle)
    return time.perf_counter() - start, state


def initiator(opts, torch, agent, tensors, names, salt, rdv, deadline, reg):
    ended = os.path.join(rdv, "target-ended")
    published = json.loads(wait_for(os.path.join(rdv, "target.json"), deadline, "metadata",
                                    ended))
    peer = agent.add_remote_agent(base64.b64decode(published["metadata"]))
    results = []
    step = 0
    try:
        for op in ("READ", "WRITE"):
            for name in names:
                tensor = tensors[name]
                local = agent.get_xfer_descs([tensor])
                remote_one = agent.get_xfer_descs([tuple(published["descs"][name])], "VRAM")
                row = {"op": op, "tensor": name, "bytes": tensor.numel(), "times_s": [],
                       "checked": 0, "wrong": 0, "first_wrong": -1, "states": [],
                       "backend": "", "error": ""}
                results.append(row)
                try:
                    handle = agent.initialize_xfer(op, local, remote_one, peer)
                    row["backend"] = agent.query_xfer_backend(handle)
                except Exception as exc:  # NIXL raises its status as an exception
                    row["error"] = "initialize_xfer: %s: %s" % (type(exc).__name__, exc)
                    print("INFO initiator %s %s: %s" % (op, name, row["error"]), flush=True)
                    continue
                for rep in range(opts.reps + 1):
                    if op == "READ":
                        fill_pattern(torch, tensor, salt["target"][name])
                        tensor.bitwise_xor_(0xFF)
                        torch.cuda.synchronize()
                    else:
                        fill_pattern(torch, tensor, salt["initiator"][name])
                        torch.cuda.synchronize()
                        put(os.path.join(rdv, "want-%d" % step), name)
                        wait_for(os.path.join(rdv, "ready-%d" % step), deadline, "target ready",
                                 ended)
                    seconds, state = timed(agent, handle, deadline)
                    row["states"].append(state)
                    if op == "READ":
                        torch.cuda.synchronize()
                        checked, wrong, first = count_wrong(torch, tensor, salt["target"][name])
                        how = where_from(torch, tensor, first, salt["target"][name],
                                         salt["target"][name]) if wrong else ""
                    else:
                        put(os.path.join(rdv, "wrote-%d" % step), "")
                        checked, wrong, first, how = json.loads(wait_for(
                            os.path.join(rdv, "checked-%d" % step), deadline, "target's check",
                            ended))
                        step += 1
                    row["checked"] += checked
                    row["wrong"] += wrong
                    if wrong and row["first_wrong"] < 0:
                        row["first_wrong"] = first
                        row["wrong_bytes_are"] = how
                    if rep > 0:
                        row["times_s"].append(seconds)
                    else:
                        row["first_s"] = seconds
                    if state != "DONE":
                        row["error"] = "transfer state %s" % state
                        break
                agent.release_xfer_handle(handle)
                median = statistics.median(row["times_s"]) if row["times_s"] else 0
                row["gbps"] = float("%.3g" % (row["bytes"] / median / 1e9)) if median else None
                print("INFO initiator %s %s: %s GB/s, median of %d (first %.3f s), %d bytes "
                      "checked, %d wrong (first at %d: %s), backend %s %s" % (
                          op, name, row["gbps"], len(row["times_s"]), row.get("first_s", 0),
                          row["checked"], row["wrong"], row["first_wrong"],
                          row.get("wrong_bytes_are", "-"), row["backend"],
                          row["error"]), flush=True)
    finally:
        put(os.path.join(rdv, "want-%d" % step), "end")
        put(os.path.join(rdv, "results.json"), json.dumps(results))
        put(os.path.join(rdv, "bye"), "")
    agent.remove_remote_agent(peer)
    agent.deregister_memory(reg)
    print("INFO initiator: done", flush=True)
    return 0


# --- the driver ------------------------------------------------------------------------------

class Checks:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, name, ok, text=""):
        print(("CHECK %s %s %s" % (name, "PASS" if ok else "FAIL", text)).rstrip(), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def skip(self, name, why):
        print("CHECK %s SKIP %s" % (name, why), flush=True)
        self.skipped += 1

    def summary(self):
        return "SUMMARY nixl_client_check: %d PASS, %d FAIL, %d SKIP" % (
            self.passed, self.failed, self.skipped)


def find_wheel(opts):
    for candidate in (opts.wheel, os.environ.get("NIXL_WHEEL")):
        if candidate:
            return candidate if os.path.isfile(candidate) else None
    found = sorted(glob.glob(os.path.join(REPO, ".whl", "nixl_cu13-*.whl")) +
                   glob.glob(os.path.join(REPO, ".whl", "nixl-*.whl")))
    return found[-1] if found else None


def install_wheel(wheel, target):
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile",
           "--disable-pip-version-check", "--quiet", "--target", target, wheel]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if out.returncode == 0:
            return "pip install --no-deps --target"
        why = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["?"]
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = [str(exc)]
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return "unzipped (pip failed: %s)" % why[0]


def have_nixl(env):
    code = ("import sys\nfor n in ('nixl_cu13', 'nixl'):\n"
            "    try:\n        __import__(n); sys.exit(0)\n    except ImportError: pass\n"
            "sys.exit(1)")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          timeout=120, check=False).returncode == 0


def gpu_probe(env):
    """(True, text) when torch sees a GPU, else (False, why): in a child, so that this process
    never initializes CUDA."""
    code = ("import torch\nprint(torch.__version__, torch.version.cuda, "
            "torch.cuda.is_available() and torch.cuda.get_device_name(0))")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=180, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, "torch probe: %s" % exc
    if out.returncode != 0:
        return False, "torch: %s" % ((out.stderr.strip().splitlines() or ["?"])[-1])
    words = out.stdout.split()
    if len(words) < 3 or words[2] == "False":
        return False, "no GPU visible to torch %s" % (words[0] if words else "?")
    return True, "torch %s (CUDA %s), %s" % (words[0], words[1], " ".join(words[2:]))


def lane_of(log_text):
    """({"read": [...], "write": [...]}, titles): for each PROTO_INFO table of UCX's of a remote
    read or write from GPU memory to GPU memory, the protocol and transport of its largest sizes
    (the row whose range ends in inf), e.g. "zero-copy cuda_ipc/cuda"; and the tables' titles.
    A table starts "| <context> <scope> cfg#N |", its next line says what it is for."""
    lanes = {"read": [], "write": []}
    titles = []
    current, expect_title = None, False
    for line in log_text.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if PROTO_HEAD.search(line):
            current, expect_title = None, True
            continue
        if expect_title and len(cells) >= 3:
            expect_title = False
            what = cells[1].lower()
            gpu_to_gpu = what.count("cuda") >= 2 and "host" not in what
            if gpu_to_gpu and ("memory read" in what or "ucp_get" in what):
                current = "read"
            elif gpu_to_gpu and ("memory write" in what or "ucp_put" in what):
                current = "write"
            if current:
                titles.append(cells[1])
            continue
        if current and len(cells) >= 4 and cells[1].endswith("inf"):
            lane = ("%s %s" % (cells[2], cells[3])).strip()
            if lane not in lanes[current]:
                lanes[current].append(lane)
    return lanes, titles


def stats_of(log_text):
    return [line.split("info:", 1)[1].strip() for line in log_text.splitlines()
            if "[vmmipc" in line and re.search(r"info:\s+(export|import|listener|open fail)",
                                               line)]


def case_env(base, case, ucx, lib, out_dir):
    env = dict(base)
    for key in list(env):
        if key.startswith(("VMMIPC_", "UCX_")) or key in ("LD_PRELOAD", "LOCAL_RANK", "RANK"):
            del env[key]
    env.update(ucx)
    env.setdefault("UCX_PROTO_INFO", "y")
    env.setdefault("UCX_LOG_LEVEL", "info")
    env["PYTHONUNBUFFERED"] = "1"
    if case in ("e",) or case.startswith("zero"):
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    else:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if case in ("b", "d"):
        env["LD_PRELOAD"] = lib
        env["VMMIPC_LOG_LEVEL"] = "info"
        env["VMMIPC_STATS"] = "1"
    return env


def run_case(opts, case, ucx, base_env, checks):
    """Runs one case; returns its rows (one per op and tensor) with lane and logs."""
    folder = os.path.join(opts.out, "case-" + case)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    rdv = os.path.join(folder, "rendezvous")
    os.makedirs(rdv)
    env = case_env(base_env, case, ucx, opts.lib, folder)
    procs = {}
    started = time.monotonic()
    for rank, role in enumerate(("target", "initiator")):
        cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--rendezvous", rdv,
               "--mib", str(opts.mib), "--multi-mib", str(opts.multi_mib), "--reps",
               str(opts.reps), "--deadline-s", str(opts.case_timeout_s - 8)]
        if case in ("c", "d"):
            cmd = [sys.executable, LAUNCHER, "--probe", "--"] + cmd
        child_env = dict(env)
        if case in ("b", "d"):
            child_env["VMMIPC_RANK"] = str(rank)
        log = open(os.path.join(folder, role + ".log"), "w")
        procs[role] = (subprocess.Popen(cmd, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                                        cwd=REPO), log)
    codes = {}
    for role, (proc, log) in procs.items():
        left = max(1, opts.case_timeout_s - (time.monotonic() - started))
        try:
            codes[role] = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            codes[role] = "timeout"
            proc.wait()
        log.close()
    seconds = time.monotonic() - started
    logs = {}
    for role in procs:
        with open(os.path.join(folder, role + ".log"), errors="replace") as handle:
            logs[role] = handle.read()
    try:
        with open(os.path.join(rdv, "results.json")) as handle:
            rows = json.load(handle)
    except (OSError, ValueError):
        rows = []
    lanes, titles = lane_of(logs["initiator"])
    for role in procs:
        for line in logs[role].splitlines():
            if line.startswith("INFO ") or line.startswith("pidfd_seccomp:"):
                print("INFO case %s %s" % (case, line[5:] if line.startswith("INFO ") else line),
                      flush=True)
        for line in stats_of(logs[role]):
            print("INFO case %s %s vmmipc stats: %s" % (case, role, line), flush=True)
    for title in sorted(set(titles))[:12]:
        print("INFO case %s proto: %s" % (case, title), flush=True)
    version = [l for l in logs["initiator"].splitlines() if re.search(r"UCX.*[Vv]ersion", l)][:1]
    for line in version:
        print("INFO case %s ucx: %s" % (case, line.strip()[:300]), flush=True)
    errors = [l for l in logs["initiator"].splitlines() + logs["target"].splitlines()
              if re.search(r"\b(UCX  ERROR|UCX  WARN|Error|Traceback|error:)", l)][:8]
    for line in errors:
        print("INFO case %s log: %s" % (case, line.strip()[:300]), flush=True)
    print("INFO case %s: exit target %s initiator %s in %.1f s; UCX %s; logs in %s" % (
        case, codes["target"], codes["initiator"], seconds,
        " ".join("%s=%s" % kv for kv in sorted(ucx.items())) or "defaults", folder), flush=True)
    for row in rows:
        row["case"] = case
        row["lane"] = "; ".join(lanes["read" if row["op"] == "READ" else "write"]) or "?"
        row["ucx"] = ucx
        print("ROW " + json.dumps(row, sort_keys=True), flush=True)
    name = "case_" + case
    complete = len(rows) == 4 and all(not r["error"] for r in rows)
    right = all(r["wrong"] == 0 and r["checked"] > 0 for r in rows) and bool(rows)
    checks.check(name + "_ran", complete and codes["target"] == 0 and codes["initiator"] == 0,
                 "exit %s/%s, %d of 4 transfers complete" % (
                     codes["target"], codes["initiator"],
                     sum(1 for r in rows if not r["error"])))
    checks.check(name + "_bytes", right, "%d bytes checked, %d wrong" % (
        sum(r["checked"] for r in rows), sum(r["wrong"] for r in rows)))
    return rows


def table(rows):
    lines = ["| case | UCX | op | tensor | GB/s (median) | first s | lane (UCX PROTO_INFO) | "
             "bytes checked | bytes wrong |", "| --- | --- | --- | --- | ---: | ---: | --- | "
             "---: | ---: |"]
    for r in rows:
        ucx = " ".join("%s=%s" % kv for kv in sorted(r["ucx"].items())) or "defaults"
        gbps = "%.3g" % r["gbps"] if r.get("gbps") is not None else (r["error"] or "-")
        lines.append("| %s | %s | %s | %s (%g MiB) | %s | %s | %s | %d | %d |" % (
            r["case"], ucx, r["op"], r["tensor"], r["bytes"] / MIB, gbps,
            "%.3f" % r["first_s"] if "first_s" in r else "-", r["lane"], r["checked"],
            r["wrong"]))
    return lines


def pick(rows_by_setting):
    """The step-zero setting whose READ and WRITE were all complete and right, fastest by the
    slower of its READ and WRITE medians on the big tensor; None when none was."""
    best, best_bw = None, 0.0
    for setting, rows in rows_by_setting.items():
        if len(rows) != 4 or any(r["error"] or r["wrong"] or not r.get("gbps") for r in rows):
            continue
        bw = min(r["gbps"] for r in rows if r["tensor"] == "big")
        if bw > best_bw:
            best, best_bw = setting, bw
    return best


def default_lib():
    for part in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if "vmmipc" in os.path.basename(part):
            return part
    path = os.path.join(REPO, os.environ.get("BUILD_DIR", "build"), "csrc", "libvmmipc.so")
    return path


def driver(opts):
    checks = Checks()
    base_env = dict(os.environ)
    base_env.pop("LD_PRELOAD", None)  # each case sets its own
    base_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, base_env.get("PYTHONPATH", "")) if p)
    opts.out = opts.out or tempfile.mkdtemp(prefix="nixl-check-")
    os.makedirs(opts.out, exist_ok=True)
    print("INFO nixl_client_check: logs in %s" % opts.out, flush=True)

    def skipped(why):
        print("SKIPPED: %s" % why, flush=True)
        checks.skip("nixl_client", why)
        print(checks.summary(), flush=True)
        return SKIP

    if importlib.util.find_spec("torch") is None:
        return skipped("torch is not installed")
    how = "installed"
    if not have_nixl(base_env):
        wheel = find_wheel(opts)
        if wheel is None:
            return skipped("nixl is not installed and no wheel was found (--wheel, NIXL_WHEEL, "
                           "or .whl/nixl_cu13-*.whl in the repository)")
        site = os.path.join(opts.out, "site")
        how = "%s %s into %s" % (os.path.basename(wheel), install_wheel(wheel, site), site)
        base_env["PYTHONPATH"] = os.pathsep.join((site, base_env["PYTHONPATH"]))
        if not have_nixl(base_env):
            return skipped("nixl does not import from %s" % how)
    print("INFO nixl: %s" % how, flush=True)
    ok, text = gpu_probe(base_env)
    if not ok:
        return skipped(text)
    print("INFO GPU: %s" % text, flush=True)
    cases = [c for c in opts.cases.split(",") if c]
    if any(c in ("b", "d") for c in cases) and not os.path.isfile(opts.lib):
        print("INFO no libvmmipc.so at %s: cases b and d skipped" % opts.lib, flush=True)
    all_rows = []
    stop_at = time.monotonic() + opts.budget_s

    def budget_left(name):
        if time.monotonic() + opts.case_timeout_s <= stop_at:
            return True
        checks.skip(name, "not run: less than %d s of --budget-s %d left" % (
            opts.case_timeout_s, opts.budget_s))
        return False

    ucx = dict(kv.split("=", 1) for kv in opts.ucx.split(",") if kv) if opts.ucx else None
    if "zero" in cases:
        sweep = {}
        for setting in [s for s in opts.sweep.split(",") if s]:
            if not budget_left("case_zero-" + setting):
                continue
            rows = run_case(opts, "zero-" + setting, SWEEP[setting], base_env, checks)
            sweep[setting] = rows
            all_rows += rows
        chosen = pick(sweep)
        print("INFO step zero chose: %s" % (chosen or "none (every setting failed)"), flush=True)
        if ucx is None:
            ucx = SWEEP[chosen] if chosen else {}
    ucx = ucx or {}
    for case in [c for c in cases if c in CASES]:
        if case in ("b", "d") and not os.path.isfile(opts.lib):
            checks.skip("case_" + case, "no libvmmipc.so at %s" % opts.lib)
            continue
        if not budget_left("case_" + case):
            continue
        all_rows += run_case(opts, case, ucx, base_env, checks)
    reference = {r["op"]: r["lane"] for r in all_rows if r["case"] == "e" and r["tensor"] == "big"}
    for case in ("b", "d"):
        lanes = {r["op"]: r["lane"] for r in all_rows if r["case"] == case and r["tensor"] == "big"}
        if reference and lanes:
            checks.check("case_%s_lane" % case, lanes == reference,
                         "%s; the reference (e, cudaMalloc): %s" % (
                             ", ".join("%s %s" % kv for kv in sorted(lanes.items())),
                             ", ".join("%s %s" % kv for kv in sorted(reference.items()))))
    print("", flush=True)
    for line in table(all_rows):
        print(line, flush=True)
    if opts.json:
        with open(opts.json, "w") as handle:
            json.dump(all_rows, handle, indent=1, sort_keys=True)
    print(checks.summary(), flush=True)
    return 1 if checks.failed else 0


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="zero," + ",".join(CASES),
                        help="comma list of zero (the step-zero sweep) and a-e")
    parser.add_argument("--sweep", default=",".join(SWEEP), help="step-zero settings to try")
    parser.add_argument("--ucx", default=None,
                        help="UCX variables for cases a-e, KEY=VAL,... (no step-zero choice)")
    parser.add_argument("--lib", default=None, help="libvmmipc.so (default: from LD_PRELOAD, "
                        "else $BUILD_DIR/csrc or build/csrc)")
    parser.add_argument("--wheel", default=None, help="nixl wheel when nixl is not installed")
    parser.add_argument("--mib", type=float, default=512)
    parser.add_argument("--multi-mib", type=float, default=72)
    parser.add_argument("--reps", type=int, default=3, help="timed transfers after one warm-up")
    parser.add_argument("--case-timeout-s", type=int, default=60)
    parser.add_argument("--budget-s", type=int, default=600,
                        help="no case is started with less than --case-timeout-s of it left")
    parser.add_argument("--out", default=None, help="folder for each case's logs")
    parser.add_argument("--json", default=None, help="write the rows here")
    parser.add_argument("--role", choices=("target", "initiator"), help=argparse.SUPPRESS)
    parser.add_argument("--rendezvous", help=argparse.SUPPRESS)
    parser.add_argument("--deadline-s", type=int, default=80, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    opts.lib = os.path.abspath(opts.lib or default_lib())
    return opts


def main(argv):
    opts = parse(argv)
    if opts.role:
        sys.path.insert(0, HERE)
        return worker(opts)
    return driver(opts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
