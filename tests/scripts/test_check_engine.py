#!/usr/bin/env python3
"""Tests of the GPU checks' engine (scripts/gpu_check/engine.py) with made-up steps: a step
that passes, fails, is gated out, runs past its timeout (and ignores SIGTERM), the budget
running out, the skip list, groups, a background step, templates, a bug in a judge, the
summary's format and exit status, and a SIGTERM to the runner itself.

  test_check_engine.py [unittest args]

Standard library only, no GPU. ctest: scripts.check_engine (unit).
"""

import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from contextlib import redirect_stdout

SOURCE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "scripts"))

from gpu_check import describe, engine  # noqa: E402
from gpu_check.steps import (FAIL, MISSED, PASS, SKIP, CheckSet, Cmd, Gate, Group,  # noqa: E402
                             Note, Outcome, Step, Wait, harness)


def check_set(items, **overrides):
    values = dict(title="test check", items=items, budget_s=60, budget_var="TEST_BUDGET_S",
                  keep_s=0, min_step_s=1, skip_var="TEST_SKIP",
                  headline=lambda c, total: "headline %ds" % total)
    values.update(overrides)
    return CheckSet(**values)


def sh(script, want_s=30, **kw):
    return Cmd(["sh", "-c", script], want_s, **kw)


class Ran:
    """One run of a check: exit status, terminal output, rows, files."""

    def __init__(self, code, terminal, out):
        self.code, self.terminal, self.out = code, terminal, out
        self.summary = self.read("summary.md")
        self.rows = [l for l in self.summary.splitlines() if l.startswith("| ") and
                     l not in ("| step | result | detail | time |", "| --- | --- | --- | --- |")]

    def read(self, name):
        with open(os.path.join(self.out, name)) as handle:
            return handle.read()

    def row(self, name):
        for line in self.rows:
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cells[0] == name:
                return cells[1:]
        raise AssertionError("no row %r in\n%s" % (name, self.summary))


class EngineTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.out = os.path.join(self.tmp.name, "out")

    def context(self, **values):
        ctx = engine.Context(self.tmp.name, self.out, dict(os.environ))
        for name, value in values.items():
            setattr(ctx, name, value)
        return ctx

    def run_check(self, items, skip="", ctx=None, **overrides):
        terminal = io.TextIOWrapper(io.BytesIO(), write_through=True)
        runner = engine.Runner(check_set(items, **overrides), ctx or self.context(), skip)
        with redirect_stdout(terminal):
            code = runner.run()
        terminal.buffer.seek(0)
        return Ran(code, terminal.buffer.read().decode(), self.out)

    def test_a_passing_step_logs_its_command_and_output(self):
        ran = self.run_check([Step("one", log="one.log", run=[sh("echo hello")])])
        self.assertEqual(ran.code, 0)
        self.assertEqual(ran.row("one")[:2], ["PASS", "exit 0"])
        self.assertEqual(ran.read("one.log"), "+ (timeout 30s) sh -c 'echo hello'\nhello\n")
        self.assertIn("hello\n", ran.terminal)
        self.assertIn("==> one: PASS - exit 0 (0s)", ran.terminal)
        self.assertEqual(ran.read("summary.partial.md"), ran.rows[0] + "\n")

    def test_the_summary_format(self):
        ran = self.run_check([Step("one", run=[sh("true")])])
        self.assertEqual(ran.summary.splitlines()[:8], [
            "", "## test check: PASS", "", "headline 0s", "", "| step | result | detail | time |",
            "| --- | --- | --- | --- |", "| one | PASS | exit 0 | 0s |"])
        self.assertTrue(ran.terminal.endswith(ran.summary))

    def test_a_failing_step_fails_the_check_and_the_rest_still_runs(self):
        ran = self.run_check([Step("bad", run=[sh("exit 3")]), Step("after", run=[sh("true")])])
        self.assertEqual(ran.code, 1)
        self.assertIn("## test check: FAIL", ran.summary)
        self.assertEqual(ran.row("bad")[:2], ["FAIL", "exit 3"])
        self.assertEqual(ran.row("after")[0], PASS)

    def test_a_missed_target_is_not_a_failure(self):
        ran = self.run_check([Step("slow", run=[sh("true")], judge=lambda c, o: (MISSED, "x"))])
        self.assertEqual(ran.code, 0)
        self.assertEqual(ran.row("slow")[0], MISSED)

    def test_a_gate_gives_its_row_and_nothing_runs(self):
        marker = os.path.join(self.tmp.name, "ran")
        ran = self.run_check([
            Step("gated", log="gated.log", run=[sh("touch " + marker)],
                 gates=[Gate("never", lambda c: False, SKIP, "not here: {out}")]),
            Step("silent", run=[sh("touch " + marker)],
                 gates=[Gate("never", lambda c: False, None)]),
            Step("unwanted", run=[sh("touch " + marker)], when=lambda c: False)])
        self.assertEqual(ran.code, 0)
        self.assertEqual(ran.row("gated"), [SKIP, "not here: " + self.out, "0s"])
        self.assertEqual(len(ran.rows), 1)
        self.assertFalse(os.path.exists(marker))
        self.assertEqual(ran.read("gated.log"), "")  # emptied when the step started

    def test_a_command_past_its_timeout(self):
        start = time.monotonic()
        ran = self.run_check([Step("sleeper", log="s.log", run=[sh("sleep 30", want_s=1)])])
        self.assertLess(time.monotonic() - start, 10)
        self.assertEqual(ran.code, 1)
        self.assertEqual(ran.row("sleeper")[:2], ["TIMEOUT", "exit 124"])

    def test_a_command_that_ignores_sigterm_is_killed(self):
        self.addCleanup(setattr, engine, "KILL_AFTER_S", engine.KILL_AFTER_S)
        engine.KILL_AFTER_S = 1
        start = time.monotonic()
        ran = self.run_check([Step("stubborn", run=[sh("trap '' TERM; sleep 30", want_s=1)])])
        self.assertLess(time.monotonic() - start, 10)
        self.assertEqual(ran.row("stubborn")[:2], ["TIMEOUT", "exit 137"])

    def test_the_budget_cuts_and_then_stops_commands(self):
        ran = self.run_check([
            Step("first", log="first.log", run=[sh("sleep 2", want_s=100)]),
            Step("second", log="second.log", run=[sh("true")])],
            budget_s=4, keep_s=0, min_step_s=2)
        self.assertRegex(ran.read("first.log"), r"^\+ \(timeout [34]s\) ")
        self.assertEqual(ran.row("first")[0], PASS)
        self.assertEqual(ran.row("second")[:2], ["TIMEOUT", "exit 200"])
        self.assertEqual(ran.read("second.log"), "not started: the time budget (4s) is spent\n")
        self.assertEqual(ran.code, 1)

    def test_the_skip_list_gives_one_row_a_name(self):
        marker = os.path.join(self.tmp.name, "ran")
        ran = self.run_check([
            Step("step a", skip_key="a", run=[sh("touch " + marker)]),
            Step("step b1", skip_key="b", run=[sh("touch " + marker)]),
            Step("step b2", skip_key="b", run=[sh("touch " + marker)], when=lambda c: 1 / 0),
            Step("step c", skip_key="c", run=[sh("true")])], skip="a,b,nosuch")
        self.assertEqual(ran.code, 0)
        self.assertEqual([r.split(" | ")[0] for r in ran.rows], ["| a", "| b", "| step c"])
        self.assertEqual(ran.row("a"), [SKIP, "TEST_SKIP", "0s"])
        self.assertFalse(os.path.exists(marker))
        self.assertIn("TEST_SKIP: no step is called nosuch (the names: a, b, c)", ran.terminal)

    def test_groups_gates_required_steps_and_nothing_ran(self):
        items = [Group("g1", gates=[Gate("never", lambda c: False, SKIP, "no g1")],
                       items=[Step("in g1", run=[sh("true")])])]
        ran = self.run_check(items, nothing_ran_code=2)
        self.assertEqual(ran.code, 2)
        self.assertIn("## test check: NOTHING RAN", ran.summary)
        self.assertEqual(ran.row("g1"), [SKIP, "no g1", "0s"])
        items = [Group("g2", items=[Step("needed", run=[sh("exit 1")], required=True),
                                    Step("left out", run=[sh("true")])]),
                 Step("after the group", run=[sh("true")])]
        ran = self.run_check(items, nothing_ran_code=2)
        self.assertEqual(ran.code, 1)
        self.assertEqual([r.split(" | ")[0] for r in ran.rows], ["| needed", "| after the group"])

    def test_a_background_step_is_judged_where_it_is_waited_for(self):
        ran = self.run_check([
            Step("bg", log="bg.log", background=True, run=[sh("sleep 1; echo BG-DONE")],
                 judge=lambda c, o: (PASS, o.first("^BG-.*"))),
            Step("fg", run=[sh("echo FG")]),
            Wait("bg"), Wait("bg")])
        self.assertEqual([r.split(" | ")[0] for r in ran.rows], ["| fg", "| bg"])
        self.assertEqual(ran.row("bg")[:2], [PASS, "BG-DONE"])
        self.assertIn("BG-DONE", ran.read("bg.log"))
        self.assertNotIn("BG-DONE\n", ran.terminal)  # its output goes to its log only

    def test_templates_values_lists_and_the_environment(self):
        ctx = self.context(flags=["-a", "-b"], none=[], value="V")
        ran = self.run_check([Step("t", log="t.log", run=[
            Cmd(["sh", "-c", 'echo "$@"; echo "E=$E U=${U-unset}"', "sh", "{flags}", "{none}",
                 "x{value}"], 30, env={"E": "{value}"}, unset=["U"])])], ctx=ctx)
        log = ran.read("t.log")
        self.assertIn("\n-a -b xV\nE=V U=unset\n", log)
        self.assertIn("+ (timeout 30s) env -u U E=V sh -c ", log)

    def test_a_value_not_produced_yet(self):
        ctx = self.context(later=None)
        ran = self.run_check([Step("early", run=[Cmd(["echo", "{later}"], 30)])], ctx=ctx)
        self.assertEqual(ran.row("early")[0], FAIL)
        self.assertIn("runner error: ValueError: no value for {later} yet", ran.row("early")[1])
        ctx.dry_run = True
        self.assertEqual(ctx.argv(["{later}"]), ["<later>"])

    def test_a_bug_in_a_judge_is_its_row(self):
        ran = self.run_check([Step("buggy", run=[sh("true")], judge=lambda c, o: 1 / 0),
                              Step("next", run=[sh("true")])])
        self.assertEqual(ran.row("buggy")[:2], [FAIL, "runner error: ZeroDivisionError: "
                                                      "division by zero"])
        self.assertEqual(ran.row("next")[0], PASS)

    def test_output_filters_copies_and_notes(self):
        ran = self.run_check([Step("io", log="io.log", run=[
            Note("a note", lambda c: ["noted"]),
            sh("echo keep-1; echo drop; echo keep-2", keep="^keep", echo=False),
            sh("echo out; echo err >&2", copy_to="{out}/copy.txt", only_if_ok=True),
            sh("echo never", when=lambda c: False)])])
        self.assertEqual(ran.read("copy.txt"), "out\n")  # the standard output alone
        log = ran.read("io.log")
        self.assertTrue(log.startswith("noted\nkeep-1\nkeep-2\n+ (timeout 30s) "), log)
        self.assertIn("out\n", log)
        self.assertIn("err\n", log)
        self.assertNotIn("never", log)

    def test_a_command_that_is_not_there(self):
        ran = self.run_check([Step("missing", run=[Cmd(["/no/such/tool"], 30)])])
        self.assertEqual(ran.row("missing")[:2], [FAIL, "exit 127"])
        self.assertIn("/no/such/tool: cannot run:", ran.terminal)

    def test_details_cannot_break_the_table(self):
        ran = self.run_check([Step("x", run=[sh("true")], judge=lambda c, o: (PASS, "a|b\nc"))])
        self.assertEqual(ran.row("x")[:2], [PASS, "a/b c"])

    def test_dry_run_runs_nothing(self):
        marker = os.path.join(self.tmp.name, "ran")
        check = check_set([Step("one", log="one.log", run=[Cmd(["touch", marker, "{later}"], 9)],
                                gates=[Gate("a thing", lambda c: 1 / 0, FAIL, "no thing")])])
        text = describe.dry_run(check, self.context(later=None), "")
        self.assertIn("1. one  (log one.log)", text)
        self.assertIn('unless a thing: FAIL row "one": no thing', text)
        self.assertIn("+ (timeout 9s) touch %s '<later>'" % marker, text)
        self.assertFalse(os.path.exists(marker))
        self.assertIn("| 1 | one |  | 9 | one.log |", describe.listing(check))


class HarnessJudgeTest(unittest.TestCase):

    def judge(self, text, rc):
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as handle:
            handle.write(text)
        self.addCleanup(os.remove, handle.name)
        return harness("demo")(engine.Context("/", "/", {}), Outcome(rc, handle.name))

    def test_summary_line(self):
        self.assertEqual(self.judge("CHECK a PASS\nSUMMARY demo: 1 PASS, 0 FAIL, 2 SKIP\n", 0),
                         (PASS, "1 PASS, 0 FAIL, 2 SKIP; exit 0"))

    def test_a_failed_check_fails_whatever_the_exit_status(self):
        self.assertEqual(self.judge("CHECK a PASS\nCHECK b FAIL x\nCHECK c FAIL\n", 0),
                         (FAIL, "1 PASS, 2 FAIL, 0 SKIP (no SUMMARY line); failed: b c; exit 0"))

    def test_skips(self):
        self.assertEqual(self.judge("nothing\n", 77)[0], SKIP)
        self.assertEqual(self.judge("SKIPPED: no GPU\n", 0)[0], SKIP)
        self.assertEqual(self.judge("CHECK a PASS\n", 124)[0], "TIMEOUT")


class SignalTest(unittest.TestCase):
    """SIGTERM to the runner: its command is killed, an "interrupted" row, the summary, exit 1."""

    def test_sigterm(self):
        with tempfile.TemporaryDirectory() as tmp:
            child = subprocess.Popen([sys.executable, __file__, "--child", tmp],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            log = os.path.join(tmp, "sleeper.log")
            deadline, pid = time.monotonic() + 30, None
            while time.monotonic() < deadline and pid is None:
                time.sleep(0.1)
                if os.path.exists(log):
                    with open(log) as handle:
                        found = re.search(r"^pid (\d+)$", handle.read(), re.M)
                    pid = int(found.group(1)) if found else None
            self.assertIsNotNone(pid, "the sleeper did not start")
            child.send_signal(signal.SIGTERM)
            output = child.communicate(timeout=30)[0].decode()
            self.assertEqual(child.returncode, 1, output)
            with open(os.path.join(tmp, "summary.md")) as handle:
                summary = handle.read()
            self.assertIn("| interrupted | FAIL | signal received | 0s |", summary)
            self.assertIn("## signal check: FAIL", summary)
            self.assertFalse(os.path.exists("/proc/%d" % pid), "the sleeper is still there")


def child(out):
    ctx = engine.Context(out, out, dict(os.environ))
    check = check_set([Step("sleeper", log="sleeper.log",
                            run=[sh("echo pid $$; exec sleep 60", want_s=120)])],
                      title="signal check", budget_s=300)
    sys.exit(engine.Runner(check, ctx).run())


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    unittest.main(verbosity=2)
