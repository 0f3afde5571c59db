#!/usr/bin/env python3
"""The report of run_registration.sh: per (N, K, chunk size), the median over its rounds of
the registration time (barrier release to the last rank done) and open p50 of legacy IPC, of
vmmipc in each mode that ran (warm: warm connections, the default; cold: a new connection per
open; nofollow: VMMIPC_FOLLOW=0; ahead: VMMIPC_AHEAD=1), and of the driver's floor (import + map + access
with the fds in hand, when the runs had --floor), with the ratios to legacy and to the floor;
then a process's first registration apart from a later one (the whole registration: gets,
all-gather, opens; the runs' gap between allocation and gets said), legacy and the floor beside.
Each run measured legacy and the floor beside vmmipc in the same rank processes, so their
columns are the medians over every mode's runs. Also the fetch alone (vmmipc_fetch_bench's
fetch.json), when present. Markdown to stdout and to OUT/registration.md. Exit 1 when a run's
data was wrong or no run is there."""
import argparse
import glob
import json
import os
import re
import statistics
import sys


MODES = ("warm", "cold", "nofollow", "ahead", "background")


def median(values):
    values = [v for v in values if isinstance(v, (int, float)) and v == v]
    return statistics.median(values) if values else None


def fmt(v, unit=""):
    return "-" if v is None else ("%.2f%s" % (v, unit))


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="run_registration.sh's output folder")
    args = parser.parse_args()
    runs = {}  # (n, mode) -> list of (config key -> config)
    first, later = {}, {}  # config key -> column -> registration us (first; later medians)
    gaps = set()
    failed = []
    for path in sorted(glob.glob(os.path.join(args.out, "reg-n*-*-r*.json"))):
        m = re.match(r"reg-n(\d+)-(%s)-r(\d+)\.json$" % "|".join(MODES), os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            data = json.load(f)
        if not data.get("ok", False):
            failed.append("%s: %s" % (path, "; ".join(data.get("failures", [])) or "not ok"))
        n, mode = int(m.group(1)), m.group(2)
        gaps.add(data.get("context", {}).get("gap_ms"))
        for cfg in data.get("configurations", []):
            key = (n, cfg["per_rank_buffers"], cfg["chunk_size"])
            row = runs.setdefault(key, {})
            # A process's first registration and the later ones' median (whole registration).
            for kind, column in (("legacy", "legacy"), ("floor", "floor"), ("vmmipc", mode)):
                part = cfg.get(kind) or {}
                if part.get("status") != "ok":
                    continue
                if part.get("first"):
                    first.setdefault(key, {}).setdefault(column, []).append(
                        part["first"]["registration_us"])
                if part.get("registration_us") is not None:
                    later.setdefault(key, {}).setdefault(column, []).append(
                        part["registration_us"])
            for kind in ("legacy", "floor"):
                part = cfg.get(kind)
                if part and part["status"] == "ok":
                    row.setdefault(kind, []).append(part["total_us"])
                    row.setdefault(kind + "_open", []).append(part["open_p50_us"])
            if cfg["vmmipc"]["status"] == "ok":
                row.setdefault(mode, []).append(cfg["vmmipc"]["total_us"])
                row.setdefault(mode + "_open", []).append(cfg["vmmipc"]["open_p50_us"])
    modes = [m for m in MODES if any(m in row for row in runs.values())]
    floor_ran = any("floor" in row for row in runs.values())
    lines = ["# vmmipc registration: %s against legacy IPC%s" % (
        ", ".join(modes) or "no mode", " and the driver's floor" if floor_ran else ""), ""]
    fetch_path = os.path.join(args.out, "fetch.json")
    if os.path.isfile(fetch_path):
        with open(fetch_path) as f:
            fetch = json.load(f)
        floor = fetch["floor"]["p50_us"]
        lines += ["## The fetch alone (vmmipc_fetch_bench, %d rounds x %d fetches per mode)"
                  % (fetch["rounds"], fetch["fetches"]), "",
                  "| mode | p50 us | p90 us | p50 / floor |", "| --- | --- | --- | --- |"]
        for mode in ("floor", "warm", "cold"):
            lines.append("| %s | %.1f | %.1f | %.2f |" % (mode, fetch[mode]["p50_us"],
                                                         fetch[mode]["p90_us"],
                                                         fetch[mode]["p50_us"] / floor))
        lines.append("")
    columns = ["legacy"] + (["floor"] if floor_ran else []) + modes
    header = ["N", "K", "size"] + ["%s ms" % c for c in columns]
    header += ["%s/legacy" % m for m in modes + (["floor"] if floor_ran else [])]
    header += ["%s/floor" % m for m in (modes if floor_ran else [])]
    header += ["open p50 us " + " / ".join(columns), "runs " + "+".join(modes)]
    lines += ["## All-to-all registration, one GPU (medians over the rounds)", "",
              "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for (n, k, size) in sorted(runs):
        row = runs[(n, k, size)]
        total = {c: median(row.get(c, [])) for c in columns}
        cells = [str(n), str(k), "%d MiB" % (size >> 20)]
        cells += [fmt(total[c] and total[c] / 1e3) for c in columns]
        cells += [fmt(ratio(total[m], total["legacy"]), "x")
                  for m in modes + (["floor"] if floor_ran else [])]
        cells += [fmt(ratio(total[m], total["floor"]), "x") for m in (modes if floor_ran else [])]
        cells.append(" / ".join(fmt(median(row.get(c + "_open", []))) for c in columns))
        cells.append("+".join(str(len(row.get(m, []))) for m in modes))
        lines.append("| " + " | ".join(cells) + " |")
    if first:
        gap = ", ".join("%s ms" % g for g in sorted(x for x in gaps if x is not None)) or "?"
        head = ["N", "K", "size"]
        for c in columns:
            head += ["%s first ms" % c, "%s later ms" % c]
        for m in modes:
            head += ["%s/legacy first" % m, "%s/legacy later" % m]
            if floor_ran:
                head += ["%s/floor first" % m, "%s/floor later" % m]
        lines += ["", "## A process's first registration and a later one (gets + all-gather + opens;"
                  " gap between allocation and gets: %s; medians over the runs)" % gap, "",
                  "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for key in sorted(first):
            n, k, size = key
            f = {c: median(first[key].get(c, [])) for c in columns}
            l = {c: median(later.get(key, {}).get(c, [])) for c in columns}
            cells = [str(n), str(k), "%d MiB" % (size >> 20)]
            for c in columns:
                cells += [fmt(f[c] and f[c] / 1e3), fmt(l[c] and l[c] / 1e3)]
            for m in modes:
                cells += [fmt(ratio(f[m], f["legacy"]), "x"), fmt(ratio(l[m], l["legacy"]), "x")]
                if floor_ran:
                    cells += [fmt(ratio(f[m], f["floor"]), "x"), fmt(ratio(l[m], l["floor"]), "x")]
            lines.append("| " + " | ".join(cells) + " |")
    if failed:
        lines += ["", "## Failed runs", ""] + ["- " + f for f in failed]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    # One line each for the GPU check's summary: the fetch alone, and K=64 x 2 MiB per N.
    if os.path.isfile(fetch_path):
        print("SUMMARY fetch p50: warm %.1f us (%.2fx the floor), cold %.1f us, floor %.1f us" % (
            fetch["warm"]["p50_us"], fetch["warm"]["p50_us"] / floor, fetch["cold"]["p50_us"],
            floor))
    for (n, k, size) in sorted(runs):
        if k == 64 and size == 2 << 20:
            row = runs[(n, k, size)]
            legacy = median(row.get("legacy", []))
            parts = ["%s %s legacy" % (m, fmt(ratio(median(row.get(m, [])), legacy), "x"))
                     for m in modes]
            if floor_ran:
                parts.append("floor %s legacy" % fmt(ratio(median(row.get("floor", [])), legacy),
                                                    "x"))
            print("SUMMARY N=%d K=64 x 2 MiB: %s" % (n, ", ".join(parts)))
    with open(os.path.join(args.out, "registration.md"), "w") as f:
        f.write(text)
    return 1 if failed or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
