#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write libshmbroker(3) from the comments of the public header.

Usage: scripts/gen_man3.py VERSION [HEADER] > client/libshmbroker.3

The header's first comment is the page's DESCRIPTION; a comment starting
"---- Title" opens a subsection; every other comment is printed below the
declarations that follow it (up to the next blank line). The page is checked
in, so that building needs no Python; tests/packaging/test_man3.sh fails when
it is out of step with the header (run 'make man3' to write it again).
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = re.compile(r'^(#ifndef SHMBROKER_H|#define SHMBROKER_H|#include|#ifdef __cplusplus|#endif|'
                  r'extern "C" \{|\}$)')


def esc(line):
    """One line of text made safe for roff."""
    line = line.replace("\\", "\\e").replace("-", "\\-")
    if line.startswith((".", "'")):
        line = "\\&" + line
    return line


def comment_text(lines):
    """The text of a comment's lines, without its /* * */ marks."""
    out = []
    for i, line in enumerate(lines):
        s = line.strip()
        if i == 0:
            s = s[2:]
        if s.endswith("*/"):
            s = s[:-2]
        if s.startswith("*"):
            s = s[1:]
        out.append(s.strip())
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return out


def paragraphs(text):
    """Roff for text lines, a blank line between paragraphs."""
    out = []
    for line in text:
        if not line:
            if out and out[-1] != ".PP":
                out.append(".PP")
        else:
            out.append(esc(line))
    return out


def code(lines):
    return [".PP", ".RS 4", ".nf", ".ft B"] + [esc(l.rstrip()) for l in lines] + \
        [".ft R", ".fi", ".RE"]


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: gen_man3.py VERSION [HEADER]\n")
        return 2
    version = argv[1]
    header = argv[2] if len(argv) == 3 else os.path.join(os.path.dirname(HERE), "client",
                                                           "shmbroker.h")
    with open(header, encoding="utf-8") as f:
        lines = f.read().splitlines()

    # Items: (comment lines, code lines), in the header's order.
    items, comment, codelines, i = [], None, [], 0
    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if s.startswith("//"):
            i += 1
            continue
        if s.startswith("/*") and not codelines:
            if comment is not None:
                items.append((comment, []))
            comment = []
            while True:
                comment.append(lines[i])
                if "*/" in lines[i]:
                    break
                i += 1
            i += 1
            continue
        if not s or SKIP.match(s):
            if comment is not None or codelines:
                items.append((comment or [], codelines))
            comment, codelines = None, []
            i += 1
            continue
        codelines.append(line)
        i += 1
    if comment is not None or codelines:
        items.append((comment or [], codelines))

    top = comment_text(items[0][0])
    out = [".\\\" SPDX-License-Identifier: Apache-2.0",
           ".\\\" Written by scripts/gen_man3.py from client/shmbroker.h: do not edit.",
           '.TH LIBSHMBROKER 3 "" "shmbroker %s" "Library Functions Manual"' % version,
           ".SH NAME",
           "libshmbroker \\- client library of shmbrokerd, the shared\\-memory object broker",
           ".SH SYNOPSIS",
           ".nf",
           ".B #include <shmbroker.h>",
           ".PP",
           ".B cc prog.c $(pkg\\-config \\-\\-cflags \\-\\-libs shmbroker)",
           ".B cc \\-static prog.c $(pkg\\-config \\-\\-static \\-\\-cflags \\-\\-libs shmbroker)",
           ".fi",
           ".SH DESCRIPTION"]
    out += paragraphs(top)
    out.append(".SH API")
    out.append(".SS Handles, objects and the daemon")
    for text, decl in items[1:]:
        text = comment_text(text) if text else []
        if text and re.match(r"^-{3,} ", text[0]):
            title = text[0].strip("- ").strip()
            out.append(".SS " + esc(title).replace('"', "\\(dq"))
            out += paragraphs(text[1:])
            if decl:
                out += code(decl)
            continue
        if decl:
            out += code(decl)
        if text:
            out.append(".PP")
            out += paragraphs(text)
    out += [".SH SEE ALSO",
            ".BR shmbrokerd (8),",
            ".BR shmbrokerctl (1);",
            "the protocol: PROTOCOL.md in the sources."]
    # A paragraph macro right after another says nothing.
    clean = []
    for line in out:
        if line == ".PP" and clean and clean[-1] in (".PP", ".SH API") or \
                (line == ".PP" and clean and clean[-1].startswith((".SS", ".SH"))):
            continue
        clean.append(line)
    sys.stdout.write("\n".join(clean) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
