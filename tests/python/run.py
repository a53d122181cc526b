#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run the Python package's tests against real daemons.

Usage: tests/python/run.py [NAME...]
Discovers tests/python/test_*.py (NAME: run only tests whose full name
contains one of these), puts client/python first on sys.path, and prints one
line per test: "PASS: module.Class.test", "FAIL: ..." with its traceback
above it, "SKIP: ... (reason)"; then "N passed, N failed" (", N skipped" when
any). Exit status 0 only when nothing failed. The daemon is $SHMBROKERD, else
build/shmbrokerd.
"""

import os
import shutil
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, HERE)


class LineResult(unittest.TestResult):
    """A result that prints one line per test as it ends."""

    def __init__(self):
        super().__init__()
        self.npassed = 0
        self.nfailed = 0
        self.nskipped = 0

    @staticmethod
    def _name(test):
        name = test.id()
        return name[len("unittest.loader."):] if name.startswith("unittest.loader.") else name

    def _say(self, line):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self.npassed += 1
        self._say("PASS: " + self._name(test))

    def _fail(self, test, err):
        self.nfailed += 1
        self._say(self._exc_info_to_string(err, test).rstrip("\n"))
        self._say("FAIL: " + self._name(test))

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._fail(test, err)

    def addError(self, test, err):
        super().addError(test, err)
        self._fail(test, err)

    def addSubTest(self, test, subtest, err):
        # A subtest that failed makes its test fail (unittest then calls no
        # addSuccess for it): say so, or the run would pass in silence.
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._fail(subtest, err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.nskipped += 1
        self._say("SKIP: %s (%s)" % (self._name(test), reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.npassed += 1
        self._say("PASS: " + self._name(test))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.nfailed += 1
        self._say("FAIL: %s (unexpected success)" % self._name(test))


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def use_asked_python(argv):
    """Run under $PYTHON when it names another interpreter than this one.

    make test sets it to Debian's python3, the one apt installs numpy for;
    the python3 first in PATH may be another installation without it.
    """
    want = os.environ.get("PYTHON")
    if not want or os.environ.get("SHMB_PYTHON_EXEC") == want:
        return
    path = want if os.sep in want else shutil.which(want)
    if path and os.path.realpath(path) != os.path.realpath(sys.executable):
        os.environ["SHMB_PYTHON_EXEC"] = want
        sys.stdout.flush()
        os.execv(path, [path, os.path.abspath(__file__)] + argv)


def main(argv):
    use_asked_python(argv)
    loader = unittest.TestLoader()
    suite = loader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    tests = list(flatten(suite))
    if argv:
        tests = [t for t in tests if any(a in t.id() for a in argv)]
    result = LineResult()
    start = time.monotonic()
    unittest.TestSuite(tests).run(result)
    summary = "%d passed, %d failed" % (result.npassed, result.nfailed)
    if result.nskipped:
        summary += ", %d skipped" % result.nskipped
    sys.stdout.write("Ran %d tests in %.1f s with Python %s (%s).\n%s\n"
                     % (len(tests), time.monotonic() - start, sys.version.split()[0],
                        sys.executable, summary))
    return 0 if result.nfailed == 0 and result.npassed + result.nskipped > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
