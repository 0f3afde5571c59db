#!/usr/bin/env python3
"""The report of run_export_off_path.sh (the background export, VMMIPC_BACKGROUND_EXPORT, off and
on in the same call): OUT/report.md and SUMMARY lines.

1. All-to-all (a2a-nN-kK-gGAP-{off,on}-rR.json, vmmipc_all_to_all --floor --no-warmup): per N, K
   and gap, a process's first registration and a later one (the whole registration: gets,
   all-gather, opens; medians over the rounds), of legacy IPC, the driver's floor (export, fds
   copied, import + map + access), vmmipc with the background export off and on, and the ratios
   from those same runs; then the opens alone (barrier to the last open), where the floor is
   import + map + access with the fds in hand.
2. SGLang-style (sglang-gGAP.json): first and steady registration per lane, ratios to legacy
   and to SGLang's own path when it ran.
3. Allocation paths (alloc.json): off, on and on/off per measurement.
Exit 1 when a run reported wrong data or nothing is there."""
import argparse
import glob
import json
import os
import re
import statistics
import sys


def median(values):
    values = [v for v in values if isinstance(v, (int, float)) and v == v]
    return statistics.median(values) if values else None


def fmt(v, unit=""):
    return "-" if v is None else "%.2f%s" % (v, unit)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def all_to_all(out, lines, summary, failed):
    rows = {}  # (n, k, gap) -> column -> {"first": [...], "later": [...], "first_open": ..}
    for path in sorted(glob.glob(os.path.join(out, "a2a-*.json"))):
        m = re.match(r"a2a-n(\d+)-k(\d+)-g(\d+)-(off|on)-r(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            data = json.load(f)
        if not data.get("ok", False):
            failed.append("%s: %s" % (path, "; ".join(data.get("failures", [])) or "not ok"))
        key = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        mode = "vmmipc " + m.group(4)
        for cfg in data.get("configurations", []):
            for kind, column in (("legacy", "legacy"), ("floor", "floor"), ("vmmipc", mode)):
                part = cfg.get(kind) or {}
                if part.get("status") != "ok":
                    continue
                cell = rows.setdefault(key, {}).setdefault(column, {})
                if part.get("first"):
                    cell.setdefault("first", []).append(part["first"]["registration_us"])
                    cell.setdefault("first_open", []).append(part["first"]["total_us"])
                cell.setdefault("later", []).append(part.get("registration_us"))
                cell.setdefault("later_open", []).append(part.get("total_us"))
    if not rows:
        return False
    columns = ["legacy", "floor", "vmmipc off", "vmmipc on"]
    for what, first_key, later_key, title in (
            ("registration", "first", "later",
             "whole registration (gets + all-gather + opens)"),
            ("opens", "first_open", "later_open",
             "opens alone (barrier to the last open; the floor: import + map + access)")):
        head = ["N", "K", "gap ms"]
        for c in columns:
            head += ["%s first ms" % c, "%s later ms" % c]
        head += ["on/off first", "on/off later", "off/legacy first", "on/legacy first",
                 "off/floor first", "on/floor first", "on/legacy later", "on/floor later", "runs"]
        lines += ["## All-to-all, one GPU: %s, a process's first and a later one "
                  "(medians over the rounds)" % title, "",
                  "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for key in sorted(rows):
            row = rows[key]
            f = {c: median(row.get(c, {}).get(first_key, [])) for c in columns}
            l = {c: median(row.get(c, {}).get(later_key, [])) for c in columns}
            cells = [str(key[0]), str(key[1]), str(key[2])]
            for c in columns:
                cells += [fmt(f[c] and f[c] / 1e3), fmt(l[c] and l[c] / 1e3)]
            cells += [fmt(ratio(f["vmmipc on"], f["vmmipc off"]), "x"),
                      fmt(ratio(l["vmmipc on"], l["vmmipc off"]), "x"),
                      fmt(ratio(f["vmmipc off"], f["legacy"]), "x"),
                      fmt(ratio(f["vmmipc on"], f["legacy"]), "x"),
                      fmt(ratio(f["vmmipc off"], f["floor"]), "x"),
                      fmt(ratio(f["vmmipc on"], f["floor"]), "x"),
                      fmt(ratio(l["vmmipc on"], l["legacy"]), "x"),
                      fmt(ratio(l["vmmipc on"], l["floor"]), "x"),
                      "%d+%d" % (len(row.get("vmmipc off", {}).get(first_key, [])),
                                 len(row.get("vmmipc on", {}).get(first_key, [])))]
            lines.append("| " + " | ".join(cells) + " |")
            if what == "registration":
                summary.append(
                    "SUMMARY first registration N=%d K=%d gap %d ms: off %s, on %s legacy "
                    "(floor %s legacy); on/floor %s; on/off %s" % (
                        key[0], key[1], key[2], fmt(ratio(f["vmmipc off"], f["legacy"]), "x"),
                        fmt(ratio(f["vmmipc on"], f["legacy"]), "x"),
                        fmt(ratio(f["floor"], f["legacy"]), "x"),
                        fmt(ratio(f["vmmipc on"], f["floor"]), "x"),
                        fmt(ratio(f["vmmipc on"], f["vmmipc off"]), "x")))
        lines.append("")
    return True


def sglang(out, lines, summary, failed):
    found = False
    for path in sorted(glob.glob(os.path.join(out, "sglang-g*.json"))):
        with open(path) as f:
            data = json.load(f)
        found = True
        failed.extend(data.get("failed", []))
        first, steady = data["first_ms"], data["steady_ms"]
        lines += ["## SGLang-style registration, %d x %d MiB, 2 ranks, gap %.2f s" % (
            data["tensors"], data["tensor_mib"], data["gap_s"]), "",
            "| lane | first ms | steady ms | first / legacy | steady / legacy | first / sglang |"
            " steady / sglang |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for lane in first:
            lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                lane, fmt(first[lane]), fmt(steady[lane]),
                fmt(ratio(first[lane], first.get("legacy")), "x"),
                fmt(ratio(steady[lane], steady.get("legacy")), "x"),
                fmt(ratio(first[lane], first.get("sglang")), "x"),
                fmt(ratio(steady[lane], steady.get("sglang")), "x")))
        lines.append("")
        summary.append("SUMMARY sglang-style gap %.2f s first: vmmipc %s, background %s legacy%s" % (
            data["gap_s"], fmt(ratio(first.get("vmmipc"), first.get("legacy")), "x"),
            fmt(ratio(first.get("background"), first.get("legacy")), "x"),
            "; background %s sglang" % fmt(ratio(first.get("background"), first.get("sglang")),
                                           "x") if first.get("sglang") else ""))
    return found


def alloc(out, lines, summary, failed):
    path = os.path.join(out, "alloc.json")
    if not os.path.isfile(path):
        return False
    with open(path) as f:
        data = json.load(f)
    failed.extend(data.get("failed", []))
    lines += ["## Allocation paths, %d GiB, expandable segments (medians of %d repeats)" % (
        data["gib"], data["repeats"]), "", "| measurement | off | on | on / off |",
        "| --- | --- | --- | --- |"]
    for key, m in data["medians"].items():
        lines.append("| %s | %s | %s | %s |" % (key, fmt(m["off"]), fmt(m["on"]),
                                                 fmt(m["ratio"], "x")))
        if key.endswith("_ms") and m["ratio"] is not None:
            summary.append("SUMMARY allocation path %s: on/off %s" % (key[:-3],
                                                                     fmt(m["ratio"], "x")))
    lines += ["- " + n for n in data.get("notes", [])] + [""]
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lines, summary, failed = ["# The background export, off and on (run_export_off_path.sh)", ""], [], []
    context = os.path.join(args.out, "context.txt")
    if os.path.isfile(context):
        with open(context) as f:
            lines += ["```", f.read().strip(), "```", ""]
    ran = [all_to_all(args.out, lines, summary, failed), sglang(args.out, lines, summary, failed),
           alloc(args.out, lines, summary, failed)]
    if failed:
        lines += ["## Failed runs", ""] + ["- " + f for f in failed] + [""]
    text = "\n".join(lines)
    sys.stdout.write(text)
    for s in summary:
        print(s)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(text + "\n" + "\n".join(summary) + "\n")
    return 1 if failed or not any(ran) else 0


if __name__ == "__main__":
    sys.exit(main())
