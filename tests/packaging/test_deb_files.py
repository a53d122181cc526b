#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Debian packages claim everything 'make install' stages with
debian/rules' settings (dh_missing fails 'make deb' on a file no *.install
names), and put the user's documents where the docs say: README.md (and
docs/*.md) in /usr/share/doc/shmbroker, the Python reference in
python3-shmbroker's doc directory, libshmbroker(3) in libshmbroker-dev.
Checked by staging the install and matching the *.install lines, without
building the packages. Prints PASS/FAIL per case."""

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = 0


def check(name, ok, why=""):
    global failures
    print(("PASS: %s" % name) if ok else ("FAIL: %s: %s" % (name, why)))
    sys.stdout.flush()
    if not ok:
        failures += 1


def rules_vars(multiarch):
    """debian/rules' MAKE_VARS, with the build flags left out."""
    with open(os.path.join(ROOT, "debian", "rules"), encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    m = re.search(r"^MAKE_VARS\s*=\s*(.*)$", text, re.M)
    out = []
    for word in re.findall(r'(\w+=(?:"[^"]*"|\S+))', m.group(1)):
        name, value = word.split("=", 1)
        if name in ("CFLAGS", "LDFLAGS", "V"):
            continue
        out.append("%s=%s" % (name, value.replace("$(DEB_HOST_MULTIARCH)", multiarch)))
    return out


def main():
    multiarch = "x86_64-linux-gnu"
    try:
        multiarch = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   check=True).stdout.decode().strip() or multiarch
    except (OSError, subprocess.CalledProcessError):
        pass
    build = os.environ.get("SHMB_BUILD_DIR") or "build"
    build = build if os.path.isabs(build) else os.path.join(ROOT, build)
    tmp = tempfile.mkdtemp(prefix="shmb-debfiles-")
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        r = subprocess.run(["make", "--no-print-directory", "-C", ROOT, "BUILD=" + build,
                            "DESTDIR=" + tmp, "install"] + rules_vars(multiarch),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        if r.returncode != 0:
            check("stage_install", False, r.stdout.decode()[-3000:])
            return 1
        staged = []
        for d, _, files in os.walk(tmp):
            staged += [os.path.relpath(os.path.join(d, f), tmp) for f in files]

        claims = {}  # package -> patterns
        for fn in os.listdir(os.path.join(ROOT, "debian")):
            if fn.endswith(".install"):
                with open(os.path.join(ROOT, "debian", fn), encoding="utf-8") as f:
                    claims[fn[:-8]] = [l.split()[0].replace("${DEB_HOST_MULTIARCH}", multiarch)
                                       for l in f if l.strip() and not l.startswith("#")]

        def owner(path):
            for pkg, pats in claims.items():
                for p in pats:
                    if fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p + "/*"):
                        return pkg
            return None

        unclaimed = sorted(p for p in staged if owner(p) is None)
        check("every_staged_file_claimed", not unclaimed, "no debian/*.install names %s" % unclaimed)
        want = {
            "usr/share/doc/shmbroker/README.md": "shmbroker",
            "usr/share/doc/shmbroker/docs/x.md": "shmbroker",
            "usr/share/doc/python3-shmbroker/python-reference.txt": "python3-shmbroker",
            "usr/share/man/man3/libshmbroker.3": "libshmbroker-dev",
        }
        for path, pkg in want.items():
            real = path.endswith("x.md") or path in staged
            check("ships " + path, real and owner(path) == pkg,
                  "staged: %s, claimed by %s, not %s" % (path in staged, owner(path), pkg))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
