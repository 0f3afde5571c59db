#!/usr/bin/env python3
"""all-to-all-report.py: vmmipc_all_to_all's JSON files -> one markdown report with the targets.

Usage:
  scripts/all-to-all-report.py RUN.json [RUN.json ...] [--markdown OUT.md] [--summary] [--strict]
                               [--expect-vmm ok|unsupported]

Each RUN.json is one launcher run (one N and one GPU count; tests/bench/run_all_to_all.sh makes
one per (N, GPUs)). Every time in a file is already the median over its repetitions. Without
--markdown the report goes to stdout; with it, --summary prints the targets.
--strict: exit 1 when a run failed (wrong data, a failed call, a rank that died), a configuration
ran fewer repetitions than planned, an open count is off, or legacy IPC did not work.
--expect-vmm: with --strict, the vmmipc status every configuration must have ("ok" with the
preload, also requiring every rank's VMMIPC_STATS report; "unsupported" without it).
A missed target is a result, not a failure. Needs only the standard library.
"""

import argparse
import json
import sys

MIB = 1 << 20
COUNTERS = ("requests_served", "chunks_served", "fds_sent", "fds_exported", "fd_cache_grants")
# (name, ranks, gpus, per-rank buffers, chunk size, bound on vmmipc total / legacy total)
TARGETS = [
    ("all-to-all K=64 x 2 MiB, N=2 on one GPU: registration within 1.5x legacy", 2, 1, 64,
     2 * MIB, 1.5),
    ("all-to-all K=64 x 2 MiB, N=8 on two GPUs: registration within 2x legacy", 8, 2, 64,
     2 * MIB, 2.0),
]


def size_text(b):
    return "%d GiB" % (b >> 30) if b % (1 << 30) == 0 else "%d MiB" % (b >> 20)


def ms(v):
    return "-" if v is None else "%.2f" % (v / 1000.0)


def us(v):
    if v is None:
        return "-"
    return "%.0f" % v if v >= 100 else "%.1f" % v


def rx(v):
    return "-" if v is None else "%.2fx" % v


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def kind_cells(k):
    if k.get("status") != "ok":
        return [k.get("status", "?")] * 3
    return [ms(k.get("total_us")), "%s / %s" % (us(k.get("open_p50_us")), us(k.get("open_p99_us"))),
            us(k.get("get_p50_us"))]


def config_row(cfg, warmup=False):
    l, v = cfg["legacy"], cfg["vmmipc"]
    reps = "warm-up" if warmup else "%d/%d" % (min(l.get("reps_run", 0), v.get("reps_run", 0))
                                               if v.get("status") == "ok" else
                                               l.get("reps_run", 0), cfg.get("reps_planned", 0))
    return ([cfg["ranks"], cfg["gpus"], cfg["per_rank_buffers"], size_text(cfg["chunk_size"]),
             cfg["chunks_per_buffer"], reps] + kind_cells(l) + kind_cells(v) +
            [rx(cfg.get("ratio_total")), rx(cfg.get("ratio_open_p50"))])


def load(path):
    with open(path) as f:
        return json.load(f)


def build(runs):
    md = ["# vmmipc all-to-all registration", ""]
    simulated = any(r["data"]["context"].get("simulated") for r in runs)
    if simulated:
        md += ["> **SIMULATED DRIVER**: host memory in tests/sim_driver, not a GPU. The numbers "
               "are meaningless as performance; they show that the benchmark runs.", ""]
    ctx = runs[0]["data"]["context"]
    md += ["- date: %s; host: %s; device: %s; CUDA driver API %s; vmmipc in the ranks: %s" % (
        ctx.get("date"), ctx.get("host"), ctx.get("device"), ctx.get("driver_version"),
        ", ".join(sorted({r["data"]["context"].get("vmmipc_in_ranks", "?") for r in runs}))),
        "- preload: `%s`" % (ctx.get("ld_preload") or "none"),
        "- every time is the median over the repetitions; total: barrier release to the last "
        "rank's reply after opening all (N-1) x K peer handles, on the launcher's clock; open "
        "and get: per call over all ranks' calls (p50 / p99)", ""]
    for r in runs:
        md.append("- `%s`" % r["data"]["context"].get("command", "?"))
    md.append("")

    targets = []
    configs = [(r, c) for r in runs for c in r["data"].get("configurations", [])]
    for name, n, g, k, chunk, bound in TARGETS:
        found = [c for _, c in configs if c["ranks"] == n and c["gpus"] == g and
                 c["per_rank_buffers"] == k and c["chunk_size"] == chunk and
                 c["chunks_per_buffer"] == 1]
        ratio = found[0].get("ratio_total") if found else None
        if ratio is None:
            why = "not run" if not found else "vmmipc %s, legacy %s" % (
                found[0]["vmmipc"].get("status"), found[0]["legacy"].get("status"))
            targets.append((name, why, "NOT MEASURED"))
        else:
            targets.append((name, "vmmipc %s ms, legacy %s ms (%s)" % (
                ms(found[0]["vmmipc"]["total_us"]), ms(found[0]["legacy"]["total_us"]),
                rx(ratio)), "MET" if ratio <= bound else "MISSED"))
    # The second importer of a chunk must not make its exporter export again: judged on the
    # counters of runs where every chunk has more than one importer.
    judged = [r for r in runs if r["data"]["context"].get("ranks", 0) > 2 and
              r["data"].get("stats", {}).get("fds_exported") is not None and
              r["data"]["stats"].get("vmm_chunks", 0) > 0]
    name = ("an already exported chunk opened by another importer: no export call "
            "(fds_exported = chunks exported, N > 2)")
    if not judged:
        targets.append((name, "no run with N > 2 reports fds_exported", "NOT MEASURED"))
    else:
        bad = [r for r in judged if r["data"]["stats"]["fds_exported"] !=
               r["data"]["stats"]["vmm_chunks"]]
        targets.append((name, "; ".join("N=%d G=%d: %d exports for %d chunks" % (
            r["data"]["context"]["ranks"], r["data"]["context"]["gpus"],
            r["data"]["stats"]["fds_exported"], r["data"]["stats"]["vmm_chunks"])
            for r in judged), "MISSED" if bad else "MET"))

    md += ["## Targets", ""]
    counts = {}
    for _, _, res in targets:
        counts[res] = counts.get(res, 0) + 1
    md.append("%d met, %d missed, %d not measured%s." % (
        counts.get("MET", 0), counts.get("MISSED", 0), counts.get("NOT MEASURED", 0),
        " (simulated driver: meaningless)" if simulated else ""))
    md.append("")
    md += table(["target", "measured", "result"], targets)
    md.append("")

    md += ["## Registration", ""]
    rows = []
    for r in sorted(runs, key=lambda r: (r["data"]["context"]["gpus"],
                                         r["data"]["context"]["ranks"])):
        w = r["data"].get("warmup")
        if w:
            rows.append(config_row(w, warmup=True))
        rows += [config_row(c) for c in r["data"].get("configurations", [])]
    md += table(["N", "GPUs", "K", "chunk", "C", "reps", "legacy total ms",
                 "legacy open p50 / p99 us", "legacy get us", "vmmipc total ms",
                 "vmmipc open p50 / p99 us", "vmmipc get us", "total vmmipc / legacy",
                 "open p50 vmmipc / legacy"], rows)
    md.append("")
    md += ["Warm-up rows: the first registration of fresh rank processes (K=1; vmmipc starts its "
           "listener and reserves its import zone there), not in the medians.", ""]

    md += ["## vmmipc counters", ""]
    rows = []
    for r in runs:
        st = r["data"].get("stats", {})
        c = r["data"]["context"]
        rows.append(["%d" % c["ranks"], "%d" % c["gpus"], "%s/%d" % (
            st.get("ranks_reporting", 0), c["ranks"])] +
            ["n/a" if st.get(k) is None else st[k] for k in COUNTERS] +
            [st.get("vmm_chunks", 0), st.get("vmm_chunk_grants", 0),
             st.get("second_importer_no_export", "n/a")])
    md += table(["N", "GPUs", "ranks reporting"] + list(COUNTERS) +
                ["chunks exported to peers", "chunk grants", "second importer: no export"], rows)
    md.append("")
    md += ["Summed over the ranks' VMMIPC_STATS reports of one launcher run (all its "
           "configurations, repetitions and the warm-up). With one export per chunk and a dup "
           "for every later grant, fds_exported equals the chunks exported to peers and "
           "fd_cache_grants the grants less that. n/a: this vmmipc does not print the counter.",
           ""]

    problems = []
    for r in runs:
        for f in r["data"].get("failures", []):
            problems.append("%s: %s" % (r["path"], f))
    if problems:
        md += ["## Failures", ""] + ["- " + p for p in problems] + [""]
    return md, targets, problems


def strict_problems(runs, expect_vmm):
    out = []
    for r in runs:
        d, path = r["data"], r["path"]
        if not d.get("ok"):
            out.append("%s: the run failed" % path)
        st = d.get("stats", {})
        if expect_vmm == "ok" and (st.get("ranks_reporting") != d["context"]["ranks"] or
                                   st.get("requests_served") is None):
            out.append("%s: %s of %d ranks printed a VMMIPC_STATS report with requests_served" % (
                path, st.get("ranks_reporting"), d["context"]["ranks"]))
        cfgs = d.get("configurations", [])
        if not cfgs:
            out.append("%s: no configuration" % path)
        for c in cfgs + ([d["warmup"]] if d.get("warmup") else []):
            what = "%s: K=%d chunk %s x %d" % (path, c["per_rank_buffers"],
                                               size_text(c["chunk_size"]), c["chunks_per_buffer"])
            kinds = [("legacy", "ok")] + ([("vmmipc", expect_vmm)] if expect_vmm else [])
            for kind, want in kinds:
                k = c[kind]
                if k.get("status") != want:
                    out.append("%s: %s is %s, expected %s (%s)" % (what, kind, k.get("status"),
                                                                    want, k.get("error", "")))
                if k.get("status") == "ok":
                    if k.get("reps_run") != c.get("reps_planned"):
                        out.append("%s: %s ran %s of %s repetitions" % (
                            what, kind, k.get("reps_run"), c.get("reps_planned")))
                    for rep in k.get("reps", []):
                        if rep.get("opens") != c["opens_per_rep"] or rep.get("total_us") is None:
                            out.append("%s: %s counted %s opens, expected %d" % (
                                what, kind, rep.get("opens"), c["opens_per_rep"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="JSON files of vmmipc_all_to_all --json")
    ap.add_argument("--markdown", help="write the report here (else stdout)")
    ap.add_argument("--summary", action="store_true", help="print the targets to stdout")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a failed or short run")
    ap.add_argument("--expect-vmm", choices=("ok", "unsupported"),
                    help="with --strict: the vmmipc status every configuration must have")
    args = ap.parse_args()

    runs = []
    for path in args.runs:
        try:
            runs.append({"path": path, "data": load(path)})
        except (OSError, ValueError) as e:
            print("all-to-all-report: cannot read %s: %s" % (path, e))
            return 1
    md, targets, problems = build(runs)
    text = "\n".join(md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
        if args.summary:
            if any(r["data"]["context"].get("simulated") for r in runs):
                print("SIMULATED DRIVER: the numbers below are meaningless")
            for name, measured, result in targets:
                print("  %-12s %s: %s" % (result, name, measured))
            for p in problems[:10]:
                print("  FAILURE " + p)
    else:
        print(text)
    if args.strict:
        bad = strict_problems(runs, args.expect_vmm)
        for p in bad:
            print("all-to-all-report: " + p)
        if bad:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
