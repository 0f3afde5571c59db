"""The GPU checks' summary.md as the tests of both step sets read it."""
import os

RESULTS = ("PASS", "FAIL", "SKIP", "TIMEOUT", "MISSED")


def read_summary(out_dir):
    """(the summary's text, {step: (result, detail)}) of a run that wrote to out_dir."""
    with open(os.path.join(out_dir, "summary.md")) as handle:
        summary = handle.read()
    rows = {}
    for line in summary.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[1] in RESULTS:
            rows[cells[0]] = (cells[1], cells[2])
    return summary, rows
