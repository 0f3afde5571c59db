#!/usr/bin/env python3
"""scripts/test-summary.py, what scripts/test.sh prints of a ctest run: one line per suite,
every skip with the reason the test gave, every failure, the exit status; unreadable or empty
results fail. On made-up ctest JUnit files; standard library only."""

import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "test-summary.py")

CASES = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="5">
  <testcase name="unit.Params.A" classname="unit.Params.A" time="0.5" status="run">
    <system-out>ok</system-out></testcase>
  <testcase name="unit.Gpu.B" classname="unit.Gpu.B" time="0.1" status="notrun">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>[ RUN      ] Gpu.B
tests/unit/x_test.cc:12: Skipped
needs two GPUs
with peer access

[  SKIPPED ] Gpu.B (0 ms)</system-out></testcase>
  <testcase name="scripts.torch" classname="scripts.torch" time="2" status="notrun">
    <skipped message="SKIP_RETURN_CODE=77"/>
    <system-out>looking for torch
SKIP: torch is not installed</system-out></testcase>
  <testcase name="sim.C" classname="sim.C" time="1.5" status="notrun">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>the last words</system-out></testcase>
  <testcase name="sim.D" classname="sim.D" time="3" status="fail">
    <failure message=""/><system-out>boom</system-out></testcase>
</testsuite>
"""


def summary(text, *args):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "results.xml")
        if text is not None:
            with open(path, "w") as handle:
                handle.write(text)
        return subprocess.run([sys.executable, SCRIPT, path, *args], capture_output=True,
                              text=True, timeout=60)


class SummaryTest(unittest.TestCase):
    def test_one_line_per_suite_and_every_skip_with_its_reason(self):
        result = summary(CASES, "--log", "build/test.log", "--not-run", "fuzz: --all")
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertEqual(result.stdout.splitlines(), [
            "unit        1 passed, 0 failed, 1 skipped  (1 s of test time)",
            "scripts     0 passed, 0 failed, 1 skipped  (2 s of test time)",
            "sim         0 passed, 1 failed, 1 skipped  (4 s of test time)",
            "skipped: unit.Gpu.B: needs two GPUs with peer access",
            "skipped: scripts.torch: torch is not installed",
            "skipped: sim.C: the last words",
            "FAILED: sim.D, the end of its output:",
            "    boom",
            "5 tests: 1 passed, 1 failed, 3 skipped (output: build/test.log)",
            "not run here: fuzz: --all"])

    def test_without_failures_it_exits_zero(self):
        passing = CASES.replace('status="fail">\n    <failure message=""/>', 'status="run">')
        result = summary(passing)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("sim         1 passed, 0 failed, 1 skipped", result.stdout)

    def test_results_missing_broken_or_empty_fail(self):
        for text in (None, "<testsuite", '<testsuite name="x" tests="0"></testsuite>'):
            result = summary(text, "--log", "L")
            self.assertEqual(result.returncode, 1, text)
            self.assertIn("see L", result.stdout + result.stderr, text)


if __name__ == "__main__":
    unittest.main()
