#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write the Python package's wheel with the standard library only.

Usage: scripts/make_wheel.py VERSION OUTDIR [PACKAGE_ROOT]

A wheel is a zip of the package's files and a dist-info directory (METADATA,
WHEEL, entry_points.txt, RECORD). Writing it here, rather than through
setuptools and the wheel package, keeps 'make wheel' offline and free of
build dependencies: the package is pure Python. VERSION is the Makefile's;
pyproject.toml must say the same, or the wheel is refused. Entries carry a
fixed date (SOURCE_DATE_EPOCH when set), so the same tree gives the same
bytes.
"""

import base64
import hashlib
import os
import sys
import time
import zipfile

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def die(msg):
    sys.stderr.write("make_wheel: %s\n" % msg)
    sys.exit(1)


def record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def metadata(project, version, readme):
    lines = ["Metadata-Version: 2.1", "Name: " + project["name"], "Version: " + version,
             "Summary: " + project["description"]]
    if "requires-python" in project:
        lines.append("Requires-Python: " + project["requires-python"])
    lic = project.get("license", {})
    if isinstance(lic, dict) and "text" in lic:
        lines.append("License: " + lic["text"])
    for c in project.get("classifiers", []):
        lines.append("Classifier: " + c)
    lines.append("Description-Content-Type: text/plain")
    return "\n".join(lines) + "\n\n" + readme + "\n"


def entry_points(project):
    out = []
    for group, entries in sorted(project.get("entry-points", {}).items()):
        out.append("[%s]" % group)
        out.extend("%s = %s" % (name, target) for name, target in sorted(entries.items()))
        out.append("")
    return "\n".join(out)


def main(argv):
    if len(argv) not in (3, 4):
        die("usage: make_wheel.py VERSION OUTDIR [PACKAGE_ROOT]")
    version, outdir = argv[1], argv[2]
    src = argv[3] if len(argv) == 4 else os.path.join(ROOT, "client", "python")
    if tomllib is None:
        die("Python %d.%d has no tomllib to read pyproject.toml: run it with Python 3.11 "
            "or later (Debian 12's python3)" % sys.version_info[:2])
    with open(os.path.join(src, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    if project.get("version") != version:
        die("pyproject.toml says version %r, the Makefile %r: make them the same "
            "(the Makefile's VERSION is the one source; see tests/packaging/test_versions.sh)"
            % (project.get("version"), version))
    name = project["name"]
    readme = project.get("readme", {})
    readme = readme.get("text", "") if isinstance(readme, dict) else ""
    distinfo = "%s-%s.dist-info" % (name, version)
    files = []
    pkgdir = os.path.join(src, name)
    for fn in sorted(os.listdir(pkgdir)):
        if os.path.isdir(os.path.join(pkgdir, fn)) and fn != "__pycache__":
            die("%s/%s is a directory: this script writes a package of one level of .py "
                "files; teach it subpackages before adding one" % (pkgdir, fn))
        if fn.endswith(".py"):
            with open(os.path.join(pkgdir, fn), "rb") as f:
                files.append(("%s/%s" % (name, fn), f.read()))
    if not files:
        die("no .py files in %s" % pkgdir)
    lic = os.path.join(ROOT, "LICENSE")
    if os.path.isfile(lic):
        with open(lic, "rb") as f:
            files.append((distinfo + "/LICENSE", f.read()))
    files.append((distinfo + "/METADATA", metadata(project, version, readme).encode()))
    files.append((distinfo + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: shmbroker make_wheel.py\n"
                  b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    eps = entry_points(project)
    if eps:
        files.append((distinfo + "/entry_points.txt", eps.encode()))
    files.append((distinfo + "/top_level.txt", (name + "\n").encode()))
    record = "".join("%s,%s,%d\n" % (path, record_hash(data), len(data)) for path, data in files)
    record += distinfo + "/RECORD,,\n"
    files.append((distinfo + "/RECORD", record.encode()))

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    stamp = time.gmtime(max(epoch, 315532800))[:6]  # a zip date starts in 1980
    os.makedirs(outdir, exist_ok=True)
    whl = os.path.join(outdir, "%s-%s-py3-none-any.whl" % (name, version))
    tmp = whl + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(tmp, whl)
    print(whl)


if __name__ == "__main__":
    main(sys.argv)
