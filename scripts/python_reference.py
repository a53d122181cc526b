#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Print the Python package's reference: pydoc's text of the package and of
each public module (those not starting with an underscore).

Usage: scripts/python_reference.py [PACKAGE_ROOT] > python-reference.txt

The package is imported from PACKAGE_ROOT (default client/python), never
from an installed copy; pydoc's FILE sections, which name where it was
imported from, are left out, so the text is the same wherever it is built.
"""

import importlib
import os
import pkgutil
import pydoc
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def without_file_section(text):
    out, skipping = [], False
    for line in text.splitlines():
        if line == "FILE":
            skipping = True
            continue
        if skipping and (line == "" or line.startswith(" ")):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(HERE), "client", "python")
    sys.path.insert(0, os.path.abspath(root))
    sys.dont_write_bytecode = True
    pkg = importlib.import_module("shmbroker")
    names = ["shmbroker"] + sorted(
        "shmbroker." + m.name for m in pkgutil.iter_modules(pkg.__path__)
        if not m.name.startswith("_"))
    parts = []
    for name in names:
        mod = importlib.import_module(name)
        parts.append(without_file_section(pydoc.render_doc(mod, "%s", renderer=pydoc.plaintext)))
    sys.stdout.write(("\n" + "=" * 78 + "\n\n").join(parts))


if __name__ == "__main__":
    main(sys.argv)
