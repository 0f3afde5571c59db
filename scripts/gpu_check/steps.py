"""The records a step set is written in, and the judges most steps share.

A step set (gpu_set.py, framework_set.py) is a list of these records; engine.py runs them.

  Step   one row of the summary table: its log, its commands and notes, the gates that
         turn it into a SKIP or FAIL row without running, and the judge that reads the
         outcome into (result, detail).
  Cmd    one command under the time budget: argv and environment as templates, the
         seconds it wants.
  Note   text the runner writes into the step's log itself (versions, a file listing).
  Gate   a condition checked before a step (or a group) runs.
  Group  steps that run only together (a framework's runs), behind gates of their own.
  Wait   where the row of a background step is collected.
  Banner a heading in the terminal output, ahead of a group.

Templates: "{name}" is replaced by the context's attribute `name` (a str, an int, or a
list: a list fills a lone "{name}" argument with its items, so an empty list adds none).
An attribute that is still None is a value an earlier step produces; --dry-run shows it
as <name>.
"""

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

PASS, FAIL, SKIP, TIMEOUT, MISSED = "PASS", "FAIL", "SKIP", "TIMEOUT", "MISSED"
FAILING = (FAIL, TIMEOUT)  # the results that make the whole check fail
NO_BUDGET = 200  # a command's status when the budget was spent before it started
TIMED_OUT = (124, 137)  # SIGTERM at the limit, SIGKILL 10 s later
# The launcher, relative to the repository root. It finds the vmmipc Python package itself
# (python/vmmipc, or scripts/python/vmmipc in older trees): nothing here names the package.
LAUNCHER = "scripts/vmmipc-run"


@dataclass(frozen=True)
class Cmd:
    argv: Sequence[str]
    want_s: int  # cut to what is left of the budget when it starts
    env: Mapping[str, str] = field(default_factory=dict)  # set for this command
    unset: Sequence[str] = ()  # removed from its environment
    when: Optional[Callable] = None  # run only when when(ctx) is true ...
    when_doc: str = ""  # ... which --dry-run shows as this
    only_if_ok: bool = False  # not run when the command before it in the step failed
    echo: bool = True  # the "+ (timeout Ns) argv" line before its output
    keep: Optional[str] = None  # a regex: only the output lines matching it are kept
    copy_to: Optional[str] = None  # its output alone also goes to this file (template)


@dataclass(frozen=True)
class Note:
    doc: str
    lines: Callable  # lines(ctx) -> lines to show and log; may set the context's values


@dataclass(frozen=True)
class Gate:
    doc: str  # what must hold
    ok: Callable  # ok(ctx) -> bool
    result: Optional[str]  # the row when it does not hold; None: no row, nothing runs
    detail: str = ""  # template


@dataclass(frozen=True)
class Step:
    name: str  # the row in the summary
    run: Sequence = ()  # Cmd and Note records, in order
    judge: Optional[Callable] = None  # judge(ctx, outcome) -> (result, detail)
    log: Optional[str] = None  # in the output folder; emptied when the step starts
    append: bool = False  # the log is appended to instead
    banner: Optional[str] = None
    skip_key: Optional[str] = None  # the name the skip list (GPU_CHECK_SKIP) uses
    when: Optional[Callable] = None  # no row at all unless when(ctx)
    when_doc: str = ""
    gates: Sequence[Gate] = ()
    remove: Sequence[str] = ()  # outputs of an earlier run removed first (templates)
    background: bool = False  # started here, judged where a Wait names it
    required: bool = False  # in a group: the rest of the group runs only when this passed
    doc: str = ""  # what counts as pass/skip/fail (--dry-run), when the judge does not say


@dataclass(frozen=True)
class Group:
    name: str  # the row when a gate does not hold
    items: Sequence
    gates: Sequence[Gate] = ()
    setup: Optional[Callable] = None  # setup(ctx), after the gates, before the steps
    setup_doc: str = ""
    counts_as_run: bool = True  # passing its gates means something ran (framework exit 2)


@dataclass(frozen=True)
class Wait:
    name: str  # a background Step's name


@dataclass(frozen=True)
class Banner:
    text: str  # a heading in the terminal output


@dataclass(frozen=True)
class CheckSet:
    title: str  # "vmmipc GPU check"
    items: Sequence
    budget_s: int
    budget_var: str  # the variable that sets the budget
    keep_s: int  # seconds kept for the summary
    min_step_s: int  # a command with less left is not started
    headline: Callable  # headline(ctx, total_s) -> the line under the title
    skip_var: Optional[str] = None  # comma list of skip keys
    appendix: Optional[Callable] = None  # appendix(ctx) -> lines after the table
    nothing_ran_code: Optional[int] = None  # exit status when no group got past its gates


class Outcome:
    """What a step's commands left: the last status, and the log to read lines from."""

    def __init__(self, rc, log_path):
        self.rc = rc
        self.log_path = log_path
        self._lines = None

    def lines(self, path=None):
        if path is None and self._lines is not None:
            return self._lines
        try:
            with open(path or self.log_path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except (OSError, TypeError):
            lines = []
        if path is None:
            self._lines = lines
        return lines

    def first(self, pattern, path=None):
        """The first match in the log (grep -m1 -o), or ""."""
        for line in self.lines(path):
            match = re.search(pattern, line)
            if match:
                return match.group(0)
        return ""

    def every(self, pattern, path=None):
        """Every match, several a line if need be (grep -o)."""
        return [m.group(0) for line in self.lines(path) for m in re.finditer(pattern, line)]

    def count(self, pattern, path=None):
        """The lines with a match (grep -c)."""
        return sum(1 for line in self.lines(path) if re.search(pattern, line))


def walk(items, depth=0, group=""):
    """Every record of a step set, groups' contents after their group: (item, depth, group)."""
    for item in items:
        yield item, depth, group
        if isinstance(item, Group):
            yield from walk(item.items, depth + 1, item.name)


def env_int(env, name, default):
    """An integer setting from the environment (default when unset or empty)."""
    text = env.get(name, "")
    try:
        return int(text) if text.strip() else default
    except ValueError:
        raise SystemExit("%s=%r: not a whole number of seconds or a count" % (name, text))


def status_result(rc):
    if rc == 0:
        return PASS
    if rc in TIMED_OUT or rc == NO_BUDGET:
        return TIMEOUT
    return FAIL


def by_status(detail):
    """PASS on exit 0, TIMEOUT on a timeout or no budget, FAIL otherwise."""

    def judge(ctx, out):
        return status_result(out.rc), ctx.fill(detail, rc=out.rc)

    judge.__doc__ = by_status.__doc__
    return judge


def harness(summary_name):
    """A harness printing CHECK <name> PASS|FAIL|SKIP lines and a SUMMARY line: FAIL when any
    CHECK failed whatever the exit status, SKIP on exit 77 or a SKIPPED: line, else by status;
    the counts (from the CHECK lines when there is no SUMMARY) and the first failed checks."""

    def judge(ctx, out):
        counts = out.first(r"^SUMMARY %s: [0-9]+ PASS, [0-9]+ FAIL, [0-9]+ SKIP" % summary_name)
        if counts:
            counts = counts.split(" ", 2)[2]
        else:
            counts = "%d PASS, %d FAIL, %d SKIP (no SUMMARY line)" % tuple(
                out.count(r"CHECK [^ ]* %s" % word) for word in ("PASS", "FAIL", "SKIP"))
        failed = [m.split(" ")[1] for m in out.every(r"CHECK [^ ]* FAIL")]
        result = status_result(out.rc)
        if result == PASS and any(line.startswith("SKIPPED:") for line in out.lines()):
            result = SKIP
        if result == PASS and failed:
            result = FAIL
        if out.rc == 77:
            result = SKIP
        # Every check skipped (a budget too short for any case): nothing ran, nothing passed.
        numbers = [int(n) for n in re.findall(r"([0-9]+) (?:PASS|FAIL|SKIP)", counts)[:3]]
        if result == PASS and len(numbers) == 3 and numbers[0] == 0 and numbers[1] == 0 \
                and numbers[2] > 0:
            result = SKIP
        names = "; failed: " + " ".join(failed[:5]) if failed else ""
        return result, "%s%s; exit %d" % (counts, names, out.rc)

    judge.__doc__ = harness.__doc__
    return judge


def judge_doc(step):
    """One line saying how the step's row is decided (for --dry-run)."""
    text = step.doc or (step.judge.__doc__ if step.judge else "") or ""
    return " ".join(text.split())

