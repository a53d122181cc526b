# SPDX-License-Identifier: Apache-2.0
"""The examples of README.md and docs/*.md: which fenced blocks run, and how.

A block runs when the line before its opening fence (blank lines aside) is
an HTML comment that marks it; the comment does not show on a rendered page:

    <!-- test: sh -->                      the block is run by sh -e
    <!-- test: python -->                  the block is a Python program
    <!-- test: c client/example.c -->      the block is that file, whole (its
                                           SPDX line aside); its build runs
    <!-- test: excerpt client/FILE.c -->   the block's lines ("..." aside) are
                                           lines of that file, in its order;
                                           its build runs
    <!-- test: output -->                  the block is what the runnable block
                                           before it prints, exactly

Every other block is left alone. Pages run in PAGES' order, blocks in the
order of their page, against one daemon (tests/python/test_docs.py).

Run as a script, it lists the runnable blocks: python3 doc_examples.py
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The order the examples run in: README first, as a newcomer reads it, then
# the pages of docs/ in a fixed order. Every page of docs/ must be listed.
PAGES = ["README.md", "docs/python.md", "docs/vllm.md", "docs/queues.md",
         "docs/c-library.md", "docs/operations.md", "docs/performance.md",
         "docs/performance-history.md",
         "docs/development.md", "docs/architecture.md", "docs/multi-host.md"]

KINDS = ("sh", "python", "c", "excerpt", "output")

_MARK = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(```+|~~~+)(.*)$")


class Block:
    """One fenced block: its page, the line of its opening fence, its info
    string, its text, and its mark (kind and argument; None when unmarked)."""

    def __init__(self, page, line, info, text, kind=None, arg=None):
        self.page = page
        self.line = line
        self.info = info
        self.text = text
        self.kind = kind
        self.arg = arg
        self.expected = None  # the text of the output block after it, if any

    def where(self):
        return "%s:%d" % (self.page, self.line)


def blocks(page, text=None):
    """Every fenced block of a page (a path relative to ROOT), in order, with
    its mark. Raises ValueError for a mark that names no known kind, a mark
    with no block under it, and a block left open."""
    if text is None:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            text = f.read()
    out = []
    mark = None
    mark_line = 0
    fence = None
    body = []
    start = 0
    info = ""
    for n, line in enumerate(text.split("\n"), 1):
        if fence is not None:
            if line.startswith(fence) and line.strip() == fence:
                kind, arg = mark if mark else (None, None)
                out.append(Block(page, start, info, "\n".join(body) + "\n", kind, arg))
                fence = None
                mark = None
            else:
                body.append(line)
            continue
        m = _FENCE.match(line)
        if m:
            fence, info, body, start = m.group(1), m.group(2).strip(), [], n
            continue
        m = _MARK.match(line)
        if m:
            words = m.group(1).split()
            if not words or words[0] not in KINDS:
                raise ValueError("%s:%d: '%s' marks no known kind of example (%s)"
                                 % (page, n, line.strip(), ", ".join(KINDS)))
            if words[0] in ("c", "excerpt") and len(words) != 2:
                raise ValueError("%s:%d: '%s' must name the source file it shows"
                                 % (page, n, line.strip()))
            mark = (words[0], words[1] if len(words) > 1 else None)
            mark_line = n
            continue
        if line.strip() and mark is not None:
            raise ValueError("%s:%d: the mark '%s' is not followed by a fenced block"
                             % (page, mark_line, mark[0]))
    if fence is not None:
        raise ValueError("%s:%d: a fenced block is never closed" % (page, start))
    if mark is not None:
        raise ValueError("%s:%d: the mark '%s' is not followed by a fenced block"
                         % (page, mark_line, mark[0]))
    return out


def runnable(pages=PAGES):
    """The blocks that run, in running order, each output block folded into
    the block before it (as .expected). Raises ValueError for an output
    block that follows no runnable block."""
    out = []
    for page in pages:
        last = None
        for b in blocks(page):
            if b.kind == "output":
                if last is None or last.expected is not None:
                    raise ValueError("%s: an output block follows no runnable block"
                                     % b.where())
                last.expected = b.text
            elif b.kind is not None:
                out.append(b)
                last = b
            # An unmarked block between them does not break the pair: the
            # output block belongs to the last runnable block of the page.
    return out


def source_text(path):
    """The text of an example's source file as a page shows it: without the
    SPDX line (a license line in a page would be noise)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and "SPDX-License-Identifier" in lines[0]:
        lines = lines[1:]
    return "\n".join(lines)


def excerpt_missing(excerpt, path):
    """The first line of an excerpt that is not found, in order, in the file
    (None when every line is): lines compare without their surrounding
    spaces; "..." lines and blank lines of the excerpt are skipped."""
    want = [ln.strip() for ln in excerpt.split("\n")]
    want = [ln for ln in want if ln and ln != "..."]
    have = [ln.strip() for ln in source_text(path).split("\n")]
    i = 0
    for ln in want:
        while i < len(have) and have[i] != ln:
            i += 1
        if i == len(have):
            return ln
        i += 1
    return None


def binary_of(path):
    """The program make builds from an example's source: client/example_queue.c
    is build/example-queue."""
    return os.path.splitext(os.path.basename(path))[0].replace("_", "-")


if __name__ == "__main__":
    for b in runnable():
        print("%-28s %s%s%s" % (b.where(), b.kind, " " + b.arg if b.arg else "",
                                " (output checked)" if b.expected is not None else ""))
    sys.exit(0)
