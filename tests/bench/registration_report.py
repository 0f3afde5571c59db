#!/usr/bin/env python3
"""The report of run_registration.sh: per (N, K, chunk size), the median over its rounds of
legacy IPC's, vmmipc's with warm connections and vmmipc's without (cold) registration time (barrier
release to the last rank done) and open p50, with the ratios to legacy; each run measured legacy
beside vmmipc in the same rank processes, so legacy's column is the median of both modes' runs.
Also the fetch alone (vmmipc_fetch_bench's fetch.json), when present. Markdown to stdout and to
OUT/registration.md. Exit 1 when a run's data was wrong or no run is there."""
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
    return "-" if v is None else ("%.2f%s" % (v, unit))


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="run_registration.sh's output folder")
    args = parser.parse_args()
    runs = {}  # (n, mode) -> list of (config key -> config)
    failed = []
    for path in sorted(glob.glob(os.path.join(args.out, "reg-n*-*-r*.json"))):
        m = re.match(r"reg-n(\d+)-(warm|cold)-r(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            data = json.load(f)
        if not data.get("ok", False):
            failed.append("%s: %s" % (path, "; ".join(data.get("failures", [])) or "not ok"))
        n, mode = int(m.group(1)), m.group(2)
        for cfg in data.get("configurations", []):
            key = (n, cfg["per_rank_buffers"], cfg["chunk_size"])
            runs.setdefault(key, {"legacy": [], "warm": [], "cold": [],
                                  "legacy_open": [], "warm_open": [], "cold_open": []})
            row = runs[key]
            if cfg["legacy"]["status"] == "ok":
                row["legacy"].append(cfg["legacy"]["total_us"])
                row["legacy_open"].append(cfg["legacy"]["open_p50_us"])
            if cfg["vmmipc"]["status"] == "ok":
                row[mode].append(cfg["vmmipc"]["total_us"])
                row[mode + "_open"].append(cfg["vmmipc"]["open_p50_us"])
    lines = ["# vmmipc registration: warm connections against cold", ""]
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
    lines += ["## All-to-all registration, one GPU (medians over the rounds)", "",
              "| N | K | size | legacy ms | warm ms | cold ms | warm/legacy | cold/legacy | "
              "open p50 us legacy / warm / cold | runs |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (n, k, size) in sorted(runs):
        row = runs[(n, k, size)]
        legacy, warm, cold = (median(row[x]) for x in ("legacy", "warm", "cold"))
        opens = "%s / %s / %s" % tuple(fmt(median(row[x + "_open"])) for x in
                                       ("legacy", "warm", "cold"))
        lines.append("| %d | %d | %d MiB | %s | %s | %s | %s | %s | %s | %d+%d |" % (
            n, k, size >> 20, fmt(legacy and legacy / 1e3), fmt(warm and warm / 1e3),
            fmt(cold and cold / 1e3), fmt(ratio(warm, legacy), "x"), fmt(ratio(cold, legacy), "x"),
            opens, len(row["warm"]), len(row["cold"])))
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
            legacy, warm, cold = (median(row[x]) for x in ("legacy", "warm", "cold"))
            print("SUMMARY N=%d K=64 x 2 MiB: warm %s legacy, cold %s legacy" % (
                n, fmt(ratio(warm, legacy), "x"), fmt(ratio(cold, legacy), "x")))
    with open(os.path.join(args.out, "registration.md"), "w") as f:
        f.write(text)
    return 1 if failed or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
