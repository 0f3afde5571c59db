#!/usr/bin/env python3
"""The summary scripts/test.sh prints of a ctest run: one line per suite (the part of a
test's name before its first dot: unit, sim, scripts, fuzz), then every skipped test with
its reason, then every failed one with the end of its output.

  test-summary.py RESULTS.xml [--log TEST_LOG] [--not-run WHAT]

RESULTS.xml is ctest's --output-junit file. A skip's reason is what the test printed for
it: GoogleTest's GTEST_SKIP message (the lines after "<file>:<line>: Skipped"), a "SKIP:"
or "skipped:" line (the scripts' exit 77), else its last line of output. --not-run adds a
line saying what this run left out and where it runs. Exit 0 when nothing failed, 1 when a
test failed or the results cannot be read. Standard library only.
"""

import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ElementTree

SKIP_LINE = re.compile(r"^\s*(?:SKIP|skipped|Skipped)\s*:\s*(.+)$")
GTEST_SKIPPED = re.compile(r":\d+: Skipped$")
FAILED_LINES = 20  # of a failed test's output, in the summary (all of it in the log)


def skip_reason(output):
    """The reason a skipped test gave, in one line."""
    lines = [line.rstrip() for line in (output or "").splitlines()]
    for i, line in enumerate(lines):
        if GTEST_SKIPPED.search(line):
            message = []
            for following in lines[i + 1:]:
                if not following or following.startswith("[  SKIPPED ]"):
                    break
                message.append(following.strip())
            if message:
                return " ".join(message)
    for line in lines:
        match = SKIP_LINE.match(line)
        if match:
            return match.group(1).strip()
    meaningful = [line for line in lines if line.strip() and not line.startswith("[")]
    return meaningful[-1].strip() if meaningful else "(it printed no reason)"


def read(path):
    """[(name, status, seconds, output)]: status is passed, failed or skipped."""
    results = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        if case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            status = "skipped"
        elif case.find("failure") is not None or case.get("status") == "fail":
            status = "failed"
        else:
            status = "passed"
        out = case.find("system-out")
        results.append((case.get("name"), status, float(case.get("time") or 0),
                        out.text if out is not None else ""))
    return results


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--log", help="the run's full output, named in the summary")
    parser.add_argument("--not-run", help="what this run left out, and where it runs")
    args = parser.parse_args(argv)
    try:
        results = read(args.results)
    except (OSError, ElementTree.ParseError) as error:
        print(f"test: no results to summarise ({error})" +
              (f"; see {args.log}" if args.log else ""), file=sys.stderr)
        return 1
    if not results:
        print("test: no test ran" + (f"; see {args.log}" if args.log else ""))
        return 1
    suites = collections.OrderedDict()
    for name, status, seconds, _ in results:
        counts = suites.setdefault(name.split(".", 1)[0], collections.Counter())
        counts[status] += 1
        counts["seconds"] += seconds
    width = max(len(suite) for suite in suites)
    for suite, counts in suites.items():
        print(f"{suite:<{width}}  {counts['passed']:4d} passed, {counts['failed']} failed, "
              f"{counts['skipped']} skipped  ({counts['seconds']:.0f} s of test time)")
    skipped = [(name, skip_reason(out)) for name, status, _, out in results
               if status == "skipped"]
    failed = [(name, out) for name, status, _, out in results if status == "failed"]
    for name, reason in skipped:
        print(f"skipped: {name}: {reason}")
    for name, out in failed:
        print(f"FAILED: {name}" + (", the end of its output:" if (out or "").strip() else ""))
        for line in (out or "").rstrip().splitlines()[-FAILED_LINES:]:
            print(f"    {line}")
    total = collections.Counter(status for _, status, _, _ in results)
    print(f"{len(results)} tests: {total['passed']} passed, {total['failed']} failed, "
          f"{total['skipped']} skipped" + (f" (output: {args.log})" if args.log else ""))
    if args.not_run:
        print(f"not run here: {args.not_run}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
