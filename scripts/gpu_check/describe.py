"""--list and --dry-run: a step set on paper, nothing run.

--list is one line a step (its row, skip key, seconds wanted, log); --dry-run adds what each
step checks before it runs, every command as it would be run (each with the seconds it wants,
as if the budget were whole; a value an earlier step produces shows as <name>) and how its row
is decided.
"""

import dataclasses

from .engine import Budget, shown
from .steps import Banner, Cmd, Group, Note, Step, Wait, judge_doc, walk


def _gate_lines(ctx, gates, name, pad):
    for gate in gates:
        if gate.result:
            yield '%sunless %s: %s row "%s": %s' % (pad, ctx.fill(gate.doc), gate.result, name,
                                                 ctx.fill(gate.detail))
        else:
            yield "%sonly when %s" % (pad, ctx.fill(gate.doc))


def _cmd_line(ctx, cmd, pad, background):
    ctx.limit = cmd.want_s
    how = ("background, " if background else "") + "timeout %ds" % cmd.want_s
    # An inline script (python3 -c '...') as its size: the step set holds its text.
    argv = ["<%d-line script>" % len(a.strip().splitlines()) if "\n" in a else a
            for a in cmd.argv]
    line = "%s+ (%s) %s" % (pad, how, shown(ctx, dataclasses.replace(cmd, argv=argv)))
    extras = [("when " + cmd.when_doc) if cmd.when else "",
              "only if the command before passed" if cmd.only_if_ok else "",
              "output kept: lines matching %s" % cmd.keep if cmd.keep else "",
              "no + line in the log" if not cmd.echo else "",
              "output also to " + ctx.fill(cmd.copy_to) if cmd.copy_to else ""]
    extras = [e for e in extras if e]
    return line + ("    [%s]" % "; ".join(extras) if extras else "")


def _step_lines(ctx, step, number, pad):
    facts = ["log " + step.log + (" (appended)" if step.append else "")] if step.log else []
    if step.skip_key:
        facts.append("skip key " + step.skip_key)
    if step.when:
        facts.append("only when " + step.when_doc)
    if step.background:
        facts.append("in the background; its row where it is waited for")
    if step.required:
        facts.append("the rest of its group needs it to pass")
    yield "%s%d. %s%s" % (pad, number, step.name, "  (%s)" % ", ".join(facts) if facts else "")
    inner = pad + "   "
    yield from _gate_lines(ctx, step.gates, step.name, inner)
    for path in step.remove:
        yield "%sremoves %s" % (inner, ctx.fill(path))
    for item in step.run:
        if isinstance(item, Note):
            yield "%snote: %s" % (inner, item.doc)
        elif isinstance(item, Cmd):
            yield _cmd_line(ctx, item, inner, step.background)
    yield "%srow: %s" % (inner, judge_doc(step) or "by the last command's exit status")


def dry_run(check, ctx, skip):
    ctx.dry_run = True
    ctx.budget = Budget(check.budget_s, check.keep_s, check.min_step_s)
    lines = ["%s: the steps in order (dry run: nothing is run)" % check.title,
             "budget %ds (%s); %ds kept for the summary; a command with less than %ds left is "
             "not started; timeouts: SIGTERM, SIGKILL 10 s later" % (
                 check.budget_s, check.budget_var, check.keep_s, check.min_step_s),
             "output folder %s: summary.md, summary.partial.md and the logs below" % ctx.out]
    if check.skip_var:
        keys = sorted({i.skip_key for i, _, _ in walk(check.items) if getattr(i, "skip_key", None)})
        lines.append("skip list %s (%s): %s" % (check.skip_var, ", ".join(keys), skip or "empty"))
    number = 0
    for item, depth, _ in walk(check.items):
        pad = "  " * depth
        if isinstance(item, Banner):
            lines.append("")
            lines.append("%s== %s" % (pad, item.text))
        elif isinstance(item, Wait):
            lines.append('%s-> the row of "%s" (if it was started)' % (pad, item.name))
        elif isinstance(item, Group):
            lines.append('%sgroup "%s"%s:' % (pad, item.name, ", counts as something run"
                                              if item.counts_as_run else ""))
            lines.extend(_gate_lines(ctx, item.gates, item.name, pad + "   "))
            if item.setup:
                lines.append("%s   setup: %s" % (pad, item.setup_doc))
        elif isinstance(item, Step):
            number += 1
            lines.extend(_step_lines(ctx, item, number, pad))
    return "\n".join(lines)


def listing(check):
    rows = ["| # | step | skip key | seconds wanted | log |", "| --- | --- | --- | --- | --- |"]
    number = 0
    for item, _, group in walk(check.items):
        if isinstance(item, Step):
            number += 1
            wants = [str(c.want_s) for c in item.run if isinstance(c, Cmd)]
            group = " (group %s)" % group if group else ""
            rows.append("| %d | %s%s | %s | %s | %s |" % (
                number, item.name, group, item.skip_key or "", " + ".join(wants) or "-",
                item.log or ""))
    return "\n".join(rows)
