"""The engine of the GPU checks: runs a step set (steps.py's records) inside one time budget
and ends with a markdown table.

It owns the budget (a command gets the seconds it wants, cut to what is left less the seconds
kept for the summary; with less than the minimum left it is not started, NO_BUDGET), the
timeout (SIGTERM to the command's process group at its limit, SIGKILL 10 s later: status 124
or 137, as coreutils' `timeout -k 10`), the output (teed to the terminal and appended to the
step's log), the rows (summary.partial.md as they come, summary.md at the end, the exit
status), the skip list, signals (an "interrupted" row, the summary, exit 1) and the dry run.
What a step runs and how its output is read is the step set's.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from datetime import datetime, timezone

from .steps import (FAILING, FAIL, NO_BUDGET, PASS, SKIP, Banner, Cmd, Group, Note, Outcome, Wait,
                    status_result, walk)

KILL_AFTER_S = 10  # from SIGTERM to SIGKILL
PUMP_GRACE_S = 5  # after a command exits, for output still held by a child of it
VALUE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")  # {name}; any other brace is text


class Interrupted(Exception):
    pass


class Budget:
    def __init__(self, total_s, keep_s, min_step_s):
        self.total_s, self.keep_s, self.min_step_s = total_s, keep_s, min_step_s
        self.start = time.monotonic()

    def elapsed(self):
        return int(time.monotonic() - self.start)

    def limit(self, want_s):
        """Seconds for the next command: what it wants, cut to what is left of the budget."""
        return min(want_s, int(self.start + self.total_s - time.monotonic()) - self.keep_s)


class Context:
    """The values templates name, and what steps learn on the way (a step set subclasses it)."""

    def __init__(self, repo, out, env, dry_run=False):
        self.repo, self.out, self.env, self.dry_run = repo, out, dict(env), dry_run
        self.limit = 0  # the current command's seconds
        self.any_ran = False
        self.budget = None

    def _value(self, name, extra):
        if name in extra:
            return extra[name]
        value = getattr(self, name)
        if value is None:
            if self.dry_run:
                return "<%s>" % name
            raise ValueError("no value for {%s} yet: the step that sets it has not run" % name)
        return value

    def fill(self, template, **extra):
        def value(match):
            found = self._value(match.group(1), extra)
            return " ".join(map(str, found)) if isinstance(found, list) else str(found)

        return VALUE.sub(value, template)

    def argv(self, items):
        argv = []
        for item in items:
            lone = VALUE.fullmatch(item)
            value = self._value(lone.group(1), {}) if lone else None
            argv.extend(map(str, value) if isinstance(value, list) else [self.fill(item)])
        return argv

    def path(self, template):
        return os.path.join(self.repo, self.fill(template))

    def probe(self, argv, timeout_s=60):
        """A quiet command (stdout only, nothing logged): (status, stdout), 127 if not found."""
        try:
            done = subprocess.run(argv, cwd=self.repo, env=self.env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  timeout=timeout_s, universal_newlines=True)
            return done.returncode, done.stdout
        except subprocess.TimeoutExpired:
            return 124, ""
        except OSError:
            return 127, ""

    def found(self, tool):
        return shutil.which(tool, path=self.env.get("PATH")) is not None


def described_commit(repo):
    """HEAD's short hash; a copy of a working tree (the device machine's) may carry older git
    metadata than its files, so say so rather than name a commit that is not what ran."""

    def git(*args):
        try:
            return subprocess.run(("git",) + args, cwd=repo, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, universal_newlines=True)
        except OSError:
            return None

    head = git("rev-parse", "--short", "HEAD")
    commit = head.stdout.strip() if head and head.returncode == 0 else "no commit"
    status = git("status", "--porcelain", "--untracked-files=no")
    if status and status.stdout.strip():
        commit += " + uncommitted changes (tracked files differ from it)"
    return commit


def utc_minute():
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def shown(ctx, cmd):
    """The command as `env -u X K=V argv...` would run it."""
    prefix = ["-u %s" % name for name in cmd.unset]
    prefix += ["%s=%s" % (k, shlex.quote(ctx.fill(v))) for k, v in cmd.env.items()]
    argv = " ".join(shlex.quote(a) for a in ctx.argv(cmd.argv))
    return ("env %s %s" % (" ".join(prefix), argv)) if prefix else argv


def _pump(stream, sinks, keep):
    """Copies a command's output, line by line, to the terminal ("-") and files."""
    files = []
    try:
        for path, mode in sinks:
            files.append(sys.stdout.buffer if path == "-" else open(path, mode))
        for raw in iter(stream.readline, b""):
            if keep and not re.search(keep, raw.decode("utf-8", "replace")):
                continue
            for handle in list(files):
                try:
                    handle.write(raw)
                    handle.flush()
                except OSError:  # a closed terminal must not stall the command or its log
                    files.remove(handle)
    finally:
        for handle in files:
            if handle is not sys.stdout.buffer:
                handle.close()
        stream.close()


def _signal_group(proc, signum):
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class Runner:
    def __init__(self, check, ctx, skip=""):
        self.check, self.ctx = check, ctx
        ctx.budget = Budget(check.budget_s, check.keep_s, check.min_step_s)
        self.skip = {name.strip() for name in skip.split(",") if name.strip()}
        self.skipped, self.rows, self.any_failed = set(), [], False
        self.running, self.pending = set(), {}

    # --- output and rows ------------------------------------------------------------------

    def say(self, log, lines):
        for line in lines:
            print(line, flush=True)
            if log:
                with open(log, "a") as handle:
                    handle.write(line + "\n")

    def record(self, name, result, detail, seconds):
        detail = detail.replace("|", "/").replace("\n", " ")
        row = "| %s | %s | %s | %ds |" % (name, result, detail, seconds)
        self.rows.append(row)
        self.any_failed = self.any_failed or result in FAILING
        with open(os.path.join(self.ctx.out, "summary.partial.md"), "a") as handle:
            handle.write(row + "\n")
        print("==> %s: %s - %s (%ds)" % (name, result, detail, seconds), flush=True)

    def summary(self):
        code, overall = 0, PASS
        if self.any_failed:
            code, overall = 1, FAIL
        elif self.check.nothing_ran_code is not None and not self.ctx.any_ran:
            code, overall = self.check.nothing_ran_code, "NOTHING RAN"
        lines = ["", "## %s: %s" % (self.check.title, overall), "",
                 self.check.headline(self.ctx, self.ctx.budget.elapsed()), "",
                 "| step | result | detail | time |", "| --- | --- | --- | --- |"] + self.rows
        if self.check.appendix:
            lines += self.check.appendix(self.ctx)
        text = "\n".join(lines) + "\n"
        sys.stdout.write(text)
        sys.stdout.flush()
        with open(os.path.join(self.ctx.out, "summary.md"), "w") as handle:
            handle.write(text)
        return code

    # --- commands -------------------------------------------------------------------------

    def _command_env(self, cmd):
        env = {k: v for k, v in self.ctx.env.items() if k not in cmd.unset}
        env.update({k: self.ctx.fill(v) for k, v in cmd.env.items()})
        return env

    def command(self, cmd, log, background=False):
        self.ctx.limit = limit = self.ctx.budget.limit(cmd.want_s)
        if limit < self.check.min_step_s:
            self.say(log, ["not started: the time budget (%ds) is spent" % self.check.budget_s])
            return NO_BUDGET
        if cmd.echo:
            how = "background, timeout" if background else "timeout"
            self.say(log, ["+ (%s %ds) %s" % (how, limit, shown(self.ctx, cmd))])
        sinks = ([] if background else [("-", None)]) + ([(log, "ab")] if log else [])
        # copy_to gets the standard output alone; the error output goes where the rest does.
        split = [sinks, sinks + [(self.ctx.path(cmd.copy_to), "wb")]] if cmd.copy_to else None
        argv, env = self.ctx.argv(cmd.argv), self._command_env(cmd)
        if background:
            done = []
            thread = threading.Thread(target=lambda: done.append(
                self._spawn(argv, env, limit, sinks, cmd.keep)), daemon=True)
            thread.start()
            return thread, done
        return self._spawn(argv, env, limit, sinks, cmd.keep, split)

    def _spawn(self, argv, env, limit, sinks, keep, split=None):
        try:
            proc = subprocess.Popen(argv, cwd=self.ctx.repo, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE if split else subprocess.STDOUT,
                                    start_new_session=True)
        except OSError as error:
            self.say(None, ["%s: cannot run: %s" % (argv[0], error.strerror)])
            return 126 if isinstance(error, PermissionError) else 127
        streams = [(proc.stderr, split[0]), (proc.stdout, split[1])] if split else [
            (proc.stdout, sinks)]
        pumps = [threading.Thread(target=_pump, args=(stream, targets, keep), daemon=True)
                 for stream, targets in streams]
        for pump in pumps:
            pump.start()
        self.running.add(proc)
        try:
            rc = self._wait(proc, limit)
        finally:
            if proc.poll() is None:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            self.running.discard(proc)
        for pump in pumps:
            pump.join(PUMP_GRACE_S)
        return rc

    @staticmethod
    def _wait(proc, limit):
        try:
            rc = proc.wait(timeout=limit)
            return 128 - rc if rc < 0 else rc
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=KILL_AFTER_S)
            return 124
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
            return 137

    # --- steps ----------------------------------------------------------------------------

    def _gate_row(self, name, gates):
        """The first gate that does not hold: (result or None); True when all hold."""
        for gate in gates:
            if not gate.ok(self.ctx):
                if gate.result:
                    self.record(name, gate.result, self.ctx.fill(gate.detail), 0)
                return gate.result
        return True

    def step(self, step):
        """Runs one step; a bug in its notes or judge is its FAIL row, not the end of the check."""
        t0 = time.monotonic()
        try:
            return self._step(step, t0)
        except (Interrupted, SystemExit):
            raise
        except Exception as error:  # noqa: BLE001  (the summary must still come)
            traceback.print_exc()
            self.record(step.name, FAIL, "runner error: %s: %s" % (type(error).__name__, error),
                        int(time.monotonic() - t0))
            return FAIL

    def _step(self, step, t0):
        ctx = self.ctx
        if step.skip_key in self.skip:  # before `when`, which may ask the machine
            if step.skip_key not in self.skipped:
                self.skipped.add(step.skip_key)
                self.record(step.skip_key, SKIP, self.check.skip_var, 0)
            return SKIP
        if step.when and not step.when(ctx):
            return None
        if step.banner:
            print("\n======== %s ========" % step.banner, flush=True)
        log = os.path.join(ctx.out, step.log) if step.log else None
        if log and not step.append:
            open(log, "w").close()
        gated = self._gate_row(step.name, step.gates)
        if gated is not True:
            return gated
        for name in step.remove:
            path = ctx.path(name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
        if step.background:
            (cmd,) = [item for item in step.run if isinstance(item, Cmd)]
            self.pending[step.name] = (step, t0, log) + self.command(cmd, log, background=True)
            return None
        rc = 0
        for item in step.run:
            if isinstance(item, Note):
                self.say(log, item.lines(ctx))
            elif not (item.when and not item.when(ctx)) and not (item.only_if_ok and rc != 0):
                rc = self.command(item, log)
        return self._judge(step, rc, log, t0)

    def _judge(self, step, rc, log, t0):
        out = Outcome(rc, log)
        if step.judge:
            result, detail = step.judge(self.ctx, out)
        else:
            result, detail = status_result(rc), "exit %d" % rc
        self.record(step.name, result, detail, int(time.monotonic() - t0))
        return result

    def collect(self, name):
        """A background step's row, once: waits for it."""
        if name not in self.pending:
            return
        step, t0, log, thread, done = self.pending.pop(name)
        thread.join()
        try:
            self._judge(step, done[0] if done else 1, log, t0)
        except Exception as error:  # noqa: BLE001  (as in step())
            traceback.print_exc()
            self.record(step.name, FAIL, "runner error: %s: %s" % (type(error).__name__, error),
                        int(time.monotonic() - t0))

    def items(self, items):
        for item in items:
            if isinstance(item, Banner):
                print("\n======== %s ========" % item.text, flush=True)
            elif isinstance(item, Group):
                self.group(item)
            elif isinstance(item, Wait):
                self.collect(item.name)
            else:
                result = self.step(item)
                if item.required and result not in (None, PASS):
                    return

    def group(self, group):
        if self._gate_row(group.name, group.gates) is not True:
            return
        self.ctx.any_ran = self.ctx.any_ran or group.counts_as_run
        if group.setup:
            group.setup(self.ctx)
        self.items(group.items)

    def _on_signal(self, signum, frame):
        raise Interrupted()

    def run(self):
        known = {getattr(item, "skip_key", None) for item, _, _ in walk(self.check.items)}
        for name in sorted(self.skip - known):
            print("%s: no step is called %s (the names: %s)" % (
                self.check.skip_var, name, ", ".join(sorted(k for k in known if k))), flush=True)
        os.makedirs(self.ctx.out, exist_ok=True)
        open(os.path.join(self.ctx.out, "summary.partial.md"), "w").close()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.items(self.check.items)
            for name in list(self.pending):
                self.collect(name)
            return self.summary()
        except Interrupted:
            for proc in list(self.running):
                _signal_group(proc, signal.SIGKILL)
            self.record("interrupted", FAIL, "signal received", 0)
            self.summary()
            return 1
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
