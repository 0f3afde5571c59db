#!/usr/bin/env python3
"""Every message docs/troubleshooting.md quotes is one the code can print.

The page's entries start with a message in bold code (**`...`**), and some list
further messages as `- `...`:` items under an entry. Each is split where the page
writes a placeholder (<...>, ...) or a value (a number, a 0x address); every piece
left (a few words) must appear in one string of csrc/ or python/, where adjacent
literals ("a " "b") count as one string and the code's own placeholders ({}, {:#x},
%s) split it as the page's split the message. A message whose wording no code has
any more fails here, naming its line, so the page cannot quote lines nobody prints.

  troubleshooting_messages.py [SOURCE_DIR]     exit 0: all found; 1: the missing ones

Messages that come from elsewhere (the dynamic loader) are marked on the page
"(from the dynamic loader)" and skipped. Standard library only.
"""

import os
import re
import sys

SOURCE_DIR = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                             os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join("docs", "troubleshooting.md")
CODE_DIRS = ("csrc", "python")
CODE_SUFFIXES = (".cc", ".h", ".def", ".in", ".py")
GAP = "\0"  # where the code has a placeholder
END = "\1"  # between two strings of the code

# A bold code span that is the whole of its bold, and a list item that starts with one.
BOLD = re.compile(r"\*\*`([^`]+)`\*\*")
ITEM = re.compile(r"^\s*- `([^`]+)`(?::|$| \()")
NOT_OURS = "(from the dynamic loader)"
# The prefix vmmipc.log and the library put before a message: not part of it.
TAG = re.compile(r"^\[vmmipc pid <[^>]*> <[^>]*>\] \w+: ")
# A placeholder, with what is glued to it (<dir>/vmmipc.<uid>.i<instance>.sock).
PLACEHOLDER = re.compile(r"[\w./@+-]*<[^<>]*>[\w./@+-]*|\.\.\.|…")
# Values the page writes where the code has a placeholder: numbers and addresses, a
# socket name's start, names in capitals (a variable, a CUresult, a flag).
VALUE = re.compile(r"0x[0-9a-fA-F]+|\d+(?: ?(?:[KMGTPE]iB|bytes)\b)?|@vmmipc\.?|"
                   r"\b[A-Z][A-Z0-9_]{2,}\b")
# The kernel's words for an errno (strerror), which the page quotes as it prints them.
ERRNO_TEXTS = {os.strerror(e) for e in range(1, 134)}
CODE_PLACEHOLDER = re.compile(r"\{[^{}]*\}|%[-+ #0-9.]*(?:l|ll|z)?[sduxXcp]")


def c_literals(text):
    """The string literals of C++ source, adjacent ones joined: a list of strings."""
    runs, current, i, last_end = [], None, 0, 0
    while i < len(text):
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
            continue
        if c == "'":  # a character literal
            match = re.compile(r"'(?:[^'\\\n]|\\.)*'").match(text, i)
            i = match.end() if match else i + 1
            continue
        if c == '"':
            match = re.compile(r'"((?:[^"\\\n]|\\.)*)"').match(text, i)
            if not match:
                i += 1
                continue
            body = unescape(match.group(1))
            if current is not None and text[last_end:i].strip() == "":
                current += body
            else:
                if current is not None:
                    runs.append(current)
                current = body
            i = last_end = match.end()
            continue
        i += 1
    if current is not None:
        runs.append(current)
    return runs


PY_STRING = re.compile(r"""(?i:[rbfu]{0,2})("{3}|'{3}|"|')""")


def python_literals(text):
    """The string literals of Python source, adjacent ones joined (across lines)."""
    runs, current, i, last_end = [], None, 0, 0
    while i < len(text):
        c = text[i]
        if c == "#":
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
            continue
        match = PY_STRING.match(text, i) if (c in "\"'rbfuRBFU") else None
        if match and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            quote = match.group(1)
            start = match.end()
            pattern = re.compile(r"((?:[^\\]|\\.)*?)" + re.escape(quote), re.S) \
                if len(quote) == 3 else \
                re.compile(r"((?:[^%s\\\n]|\\.)*)%s" % (quote, quote))
            body = pattern.match(text, start)
            if not body:
                i += 1
                continue
            value = unescape(body.group(1))
            between = text[last_end:i]
            if current is not None and re.fullmatch(r"[\s\\]*", between):
                current += value
            else:
                if current is not None:
                    runs.append(current)
                current = value
            i = last_end = body.end()
            continue
        i += 1
    if current is not None:
        runs.append(current)
    return runs


def unescape(body):
    return (body.replace('\\"', '"').replace("\\'", "'").replace("\\n", GAP)
            .replace("\\t", GAP).replace("\\\\", "\\"))


def code_strings(source_dir):
    strings = []
    for top in CODE_DIRS:
        for root, _, files in os.walk(os.path.join(source_dir, top)):
            for name in files:
                if not name.endswith(CODE_SUFFIXES):
                    continue
                with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                    text = f.read()
                found = python_literals(text) if name.endswith(".py") else c_literals(text)
                strings += [CODE_PLACEHOLDER.sub(GAP, s).replace("{{", "{").replace("}}", "}")
                            for s in found]
    return strings


def quoted_messages(doc_path):
    """(line number, message) for every message the page quotes."""
    messages = []
    with open(doc_path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            found = [m for m in BOLD.finditer(line)]
            for match in found:
                if line[match.end():].lstrip().startswith(NOT_OURS):
                    continue
                messages.append((number, match.group(1)))
            item = ITEM.match(line)
            if item and not found:
                messages.append((number, item.group(1)))
    return messages


SPLIT = re.compile(r": |; |, |\(|\)|\?")


def pieces(message):
    """The parts of a message the code must have: split at placeholders and values, and
    where messages are put together (": ", "; ", ", ", parentheses)."""
    message = TAG.sub("", message)
    parts = []
    for part in PLACEHOLDER.split(message):
        for value_free in VALUE.split(part):
            for piece in SPLIT.split(value_free):
                piece = piece.strip(" .,:;()'\"=/|-+[]")
                if sum(ch.isalpha() for ch in piece) >= 4 and piece not in ERRNO_TEXTS:
                    parts.append(piece)
    return parts


class Code:
    """Every string of the code, one haystack: strings apart by END, placeholders GAP."""

    def __init__(self, strings):
        self.text = END + END.join(strings) + END

    def has(self, piece):
        if piece in self.text:
            return True
        # Put together at run time: the piece's words in runs, each run ending or
        # starting at a placeholder or a string's end ("{} within {} s" with the kind
        # "refusals and dropped connections" passed in).
        words = piece.split(" ")
        n = len(words)
        edge = "[" + GAP + END + "]"

        def run(i, j):
            body = re.escape(" ".join(words[i:j]))
            pattern = ("" if i == 0 else edge + " ?") + body + ("" if j == n else " ?" + edge)
            return re.search(pattern, self.text) is not None

        # A run of one short word inside the piece would match almost anywhere.
        def allowed(i, j):
            return j - i >= 2 or len(words[i]) >= 5 or i == 0 or j == n

        covered = [True] + [False] * n
        for j in range(1, n + 1):
            covered[j] = any(covered[i] and allowed(i, j) and run(i, j) for i in range(j))
        return covered[n]


def missing(source_dir=SOURCE_DIR):
    """[(line, message, [pieces no code string holds])] for the page's messages."""
    code = Code(code_strings(source_dir))
    result = []
    for number, message in quoted_messages(os.path.join(source_dir, DOC)):
        absent = [piece for piece in pieces(message) if not code.has(piece)]
        if absent:
            result.append((number, message, absent))
    return result


# Lines the code printed once and prints no more (this page quoted them): the check must
# find them missing, or it could not fail.
GONE = ["listener <address>: accept failed <n> more times in the last 60 s",
        "export arena off: [<base>, +<size>) overlaps the import zone at <zone>"]


def main():
    code = Code(code_strings(SOURCE_DIR))
    for message in GONE:
        if all(code.has(piece) for piece in pieces(message)):
            print(f"the check cannot fail: it finds `{message}`, which no code prints")
            return 1
    messages = quoted_messages(os.path.join(SOURCE_DIR, DOC))
    problems = missing()
    for number, message, absent in problems:
        print(f"{DOC}:{number}: no code prints `{message}` (not found: "
              f"{'; '.join(repr(p) for p in absent)})")
    print(f"{len(messages) - len(problems)} of {len(messages)} quoted messages found in "
          f"{' and '.join(d + '/' for d in CODE_DIRS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
