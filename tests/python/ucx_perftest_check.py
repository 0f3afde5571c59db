#!/usr/bin/env python3
"""UCX directly, without NIXL: ucx_perftest's one-sided GET and PUT between two processes on one
GPU, on VMM memory, with and without vmmipc, with pidfd_getfd allowed and refused.

  ucx_perftest_check.py --lib LIBVMMIPC --shim LIBVMM_CUDA_MALLOC [--wheel WHL] [--cases a,b,c,d,e]
                        [--size-mib 256] [--iters 20] [--out DIR] [--json FILE]

ucx_perftest comes from the libucx-cu13 wheel (--wheel, else UCX_WHEEL, else .whl/libucx_cu13-*.whl;
1.22.0 carries bin/ucx_perftest), unpacked into --out. Its CUDA buffers come from cudaMalloc, so
the test double tests/gpu/vmm_cuda_malloc.cc (built as libvmm_cuda_malloc.so) is preloaded to
make them VMM memory: cuMemCreate chunks of 20 MiB mapped back to back, as PyTorch's expandable
segments. The cases, each a server and a client (127.0.0.1) on GPU 0, every op in each:

  a  VMM memory, no vmmipc                       (UCX 1.22's own path for VMM memory, if any)
  b  VMM memory, vmmipc preloaded                (the legacy cuda_ipc path through vmmipc)
  c  as a, pidfd_getfd refused (a seccomp filter, tests/python/pidfd_seccomp.py)
  d  as b, pidfd_getfd refused
  e  cudaMalloc memory, no vmmipc                (the reference lane)

UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on (UCX turns cuda_ipc's get off when it sees no NVLink: two
processes on one GPU) and UCX_PROTO_INFO=y (the lane). Which path UCX took on VMM memory is read
from the lane and, with vmmipc, from its VMMIPC_STATS report in the server (handles exported and
requests served: the legacy path through vmmipc). ucx_perftest checks no data; the NIXL check
(nixl_client_check.py) checks every byte. Prints INFO, ROW (JSON), CHECK lines, a table and
`SUMMARY ucx_perftest_check: N PASS, M FAIL, 0 SKIP`. Exit 0 when every case ran, 1 when one failed to
run, 77 (a SKIPPED: line) when there is no wheel, no GPU, or a library is missing.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SECCOMP = os.path.join(HERE, "pidfd_seccomp.py")
SKIP = 77
CASE_TEXT = {
    "a": "VMM memory, no vmmipc",
    "b": "VMM memory, vmmipc",
    "c": "VMM memory, no vmmipc, pidfd_getfd refused",
    "d": "VMM memory, vmmipc, pidfd_getfd refused",
    "e": "cudaMalloc (reference), no vmmipc",
}
OPS = ("ucp_get", "ucp_put_bw")  # ucx_perftest's test names (ucp_put alone is refused)
CHECKS = []


def check(name, ok, detail):
    CHECKS.append(bool(ok))
    print("CHECK %s %s %s" % (name, "PASS" if ok else "FAIL", detail), flush=True)


def find_wheel(given):
    for pattern in (given, os.environ.get("UCX_WHEEL"),
                    os.path.join(REPO, ".whl", "libucx_cu13-*.whl")):
        if pattern:
            found = sorted(glob.glob(pattern))
            if found:
                return found[-1]
    return None


def unpack(wheel, out):
    root = os.path.join(out, "ucx")
    perftest = os.path.join(root, "libucx", "bin", "ucx_perftest")
    if not os.path.exists(perftest):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root)
        for name in glob.glob(os.path.join(root, "libucx", "bin", "*")):
            os.chmod(name, 0o755)
    return root, perftest


def lane_of(text, op):
    """The last column of the PROTO_INFO row 0..inf of the GPU-to-GPU table for `op`."""
    verb = "read by ucp_get" if op == "ucp_get" else "write by ucp_put"
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if verb in line and "into cuda" in line or verb in line and "to cuda" in line:
            for row in lines[i:i + 12]:
                # UCX prefixes each line with its timestamp and process: search, not match.
                m = re.search(r"\|\s*0\.\.inf\s*\|\s*([^|]*)\|\s*([^|]*)\|", row)
                if m:
                    return ("%s %s" % (m.group(1).strip(), m.group(2).strip())).strip()
    return "not shown"


def final_bandwidth(text):
    """MB/s (overall) from ucx_perftest's `Final:` row."""
    for line in text.splitlines():
        if line.strip().startswith("Final:"):
            fields = line.split()
            try:
                return float(fields[6])  # iters, p50, avg, overall us, bw avg, bw overall
            except (IndexError, ValueError):
                return None
    return None


def stats_of(text):
    """vmmipc's VMMIPC_STATS report in a process's log ("export: none": no handle exported)."""
    out = {}
    if re.search(r"info:\s+export: none", text):
        out["handles_exported"] = 0
    if re.search(r"info:\s+import: none", text):
        out["handles_opened"] = 0
    for key in ("handles_exported", "requests_served", "handles_opened"):
        m = re.findall(r"%s=(\d+)" % key, text)
        if m:
            out[key] = int(m[-1])
    return out


def run_case(case, op, args, root, perftest, port):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)
           and not k.startswith("VMMIPC_") and not k.startswith("UCX_")}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [os.path.join(root, "libucx", "lib"), env.get("LD_LIBRARY_PATH", "")])
    env.update(UCX_CUDA_IPC_ENABLE_GET_ZCOPY="on", UCX_PROTO_INFO="y", CUDA_VISIBLE_DEVICES="0")
    preload = []
    if case in ("b", "d"):
        preload.append(os.path.abspath(args.lib))
        env["VMMIPC_STATS"] = "1"
    if case != "e":
        preload.append(os.path.abspath(args.shim))
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    wrap = [sys.executable, SECCOMP, "--"] if case in ("c", "d") else []
    common = ["-t", op, "-m", "cuda,cuda", "-s", str(args.size_mib << 20), "-n", str(args.iters),
              "-w", "2", "-p", str(port)]
    logs = [os.path.join(args.out, "case-%s-%s-%s.log" % (case, op, who))
            for who in ("server", "client")]
    with open(logs[0], "w") as server_log, open(logs[1], "w") as client_log:
        server = subprocess.Popen(wrap + [perftest] + common, env=env, stdout=server_log,
                                  stderr=subprocess.STDOUT)
        time.sleep(1.0)  # the server's listen; the client retries its connect anyway
        try:
            client_rc = subprocess.run(wrap + [perftest, "127.0.0.1"] + common, env=env,
                                       stdout=client_log, stderr=subprocess.STDOUT,
                                       timeout=args.timeout_s).returncode
        except subprocess.TimeoutExpired:
            client_rc = 124
        try:
            server_rc = server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server_rc = 124
    client_text, server_text = (open(p, errors="replace").read() for p in reversed(logs))
    row = {"case": case, "op": op, "mib": args.size_mib, "client_rc": client_rc,
           "server_rc": server_rc, "mbps": final_bandwidth(client_text),
           "lane": lane_of(client_text + server_text, op),
           "vmmipc_server": stats_of(server_text), "vmmipc_client": stats_of(client_text)}
    print("ROW " + json.dumps(row, sort_keys=True), flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", required=True, help="libvmmipc.so")
    parser.add_argument("--shim", required=True, help="libvmm_cuda_malloc.so")
    parser.add_argument("--wheel", help="the libucx-cu13 wheel (default UCX_WHEEL, .whl/)")
    parser.add_argument("--cases", default="a,b,c,d,e")
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout-s", type=int, default=60)
    parser.add_argument("--out", default="ucx-perftest")
    parser.add_argument("--json")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    if any(c not in CASE_TEXT for c in cases):
        parser.error("--cases from a,b,c,d,e")
    wheel = find_wheel(args.wheel)
    missing = [what for what, path in (("the libucx-cu13 wheel", wheel), ("--lib", args.lib),
                                       ("--shim", args.shim)) if not path or not os.path.exists(path)]
    if missing:
        print("SKIPPED: not run: %s missing" % ", ".join(missing))
        return SKIP
    if subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode != 0:
        print("SKIPPED: no GPU (nvidia-smi -L failed)")
        return SKIP
    os.makedirs(args.out, exist_ok=True)
    root, perftest = unpack(wheel, args.out)
    print("INFO wheel %s; ucx_perftest %s" % (os.path.basename(wheel), perftest), flush=True)
    rows = []
    port = 13400 + os.getpid() % 500
    for case in cases:
        for op in OPS:
            port += 1
            row = run_case(case, op, args, root, perftest, port)
            rows.append(row)
            check("case_%s_%s_ran" % (case, op), row["client_rc"] == 0 and row["mbps"],
                  "client exit %s, server exit %s, %s MB/s, lane %s (%s)" % (
                      row["client_rc"], row["server_rc"], row["mbps"], row["lane"],
                      CASE_TEXT[case]))
    print("\n| case | op | GB/s | lane | vmmipc in the server |")
    print("| --- | --- | ---: | --- | --- |")
    for r in rows:
        served = r["vmmipc_server"]
        print("| %s: %s | %s | %s | %s | %s |" % (
            r["case"], CASE_TEXT[r["case"]], r["op"],
            "%.1f" % (r["mbps"] / 1e3) if r["mbps"] else "-", r["lane"],
            "-" if not served else "handles_exported %s, requests_served %s" % (
                served.get("handles_exported"), served.get("requests_served"))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    failed = CHECKS.count(False)
    print("SUMMARY ucx_perftest_check: %d PASS, %d FAIL, 0 SKIP" % (len(CHECKS) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
