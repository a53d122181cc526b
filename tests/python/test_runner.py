# SPDX-License-Identifier: Apache-2.0
"""The runner's own result: what it counts is what make test believes."""

import io
import os
import sys
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import run  # noqa: E402


class _Sample(unittest.TestCase):
    """Not collected (no test_ prefix in its module): run by hand below."""

    def subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)

    def plain(self):
        pass


class RunnerTest(unittest.TestCase):
    def _run(self, name):
        result = run.LineResult()
        with redirect_stdout(io.StringIO()) as out:
            _Sample(name).run(result)
        return result, out.getvalue()

    def test_failed_subtest_fails_the_run(self):
        """A subtest that fails is counted and printed as a failure, and
        its test is not counted as passed."""
        result, out = self._run("subtests")
        self.assertEqual(result.nfailed, 1, out)
        self.assertEqual(result.npassed, 0, out)
        self.assertIn("FAIL: ", out)

    def test_plain_pass_counts(self):
        result, out = self._run("plain")
        self.assertEqual((result.npassed, result.nfailed), (1, 0), out)


if __name__ == "__main__":
    unittest.main()
