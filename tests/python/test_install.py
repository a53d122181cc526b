# SPDX-License-Identifier: Apache-2.0
"""Installing the package: make install puts it where python3 finds it under
PREFIX (Debian's dist-packages), make uninstall removes it, and pip installs
client/python offline."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import support


def run(argv, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def python3():
    """The python3 that make's install targets ask for their version."""
    return shutil.which("python3")


@unittest.skipIf(shutil.which("make") is None or python3() is None, "make or python3 is absent")
class TestMakeInstall(unittest.TestCase):
    def test_install_and_uninstall(self):
        tmp = tempfile.mkdtemp(prefix="shmb-install-")
        self.addCleanup(shutil.rmtree, tmp, True)
        make = ["make", "--no-print-directory", "-C", support.ROOT, "DESTDIR=" + tmp,
                "PREFIX=/usr/local"]
        if os.environ.get("SHMB_BUILD_DIR"):  # the build the tests run (tests/run.sh)
            make.append("BUILD=" + os.environ["SHMB_BUILD_DIR"])
        out = run(make + ["install"])
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        ver = run([python3(), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        site = os.path.join(tmp, "usr", "local", "lib", "python" + ver.stdout.decode().strip(),
                            "dist-packages")
        self.assertTrue(os.path.isfile(os.path.join(site, "shmbroker", "client.py")))
        env = dict(os.environ, PYTHONPATH=site)
        out = run([python3(), "-c", "import shmbroker, sys; print(shmbroker.__file__); "
                   "print(shmbroker.Client.__doc__ is not None)"], env=env, cwd=tmp)
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        self.assertTrue(out.stdout.decode().startswith(os.path.join(site, "shmbroker")),
                        out.stdout.decode())
        out = run(make + ["uninstall"])
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        self.assertFalse(os.path.exists(os.path.join(site, "shmbroker")))


def have_pip():
    """pip, setuptools and a wheel builder (the wheel package, or a
    setuptools that has bdist_wheel itself)."""
    return run([sys.executable, "-m", "pip", "--version"]).returncode == 0 and \
        run([sys.executable, "-c", "import setuptools, importlib.util as u; "
             "assert u.find_spec('wheel') or u.find_spec('setuptools.command.bdist_wheel')"]
            ).returncode == 0


@unittest.skipIf(not have_pip(), "pip, setuptools or wheel is absent for this python3 "
                 "(Debian: python3-pip, python3-setuptools)")
class TestPipInstall(unittest.TestCase):
    def test_pip_install_offline(self):
        tmp = tempfile.mkdtemp(prefix="shmb-pip-")
        self.addCleanup(shutil.rmtree, tmp, True)
        # A copy, so that pip's in-tree build leaves nothing in the source.
        src = os.path.join(tmp, "src")
        shutil.copytree(support.PACKAGE_DIR, src,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        target = os.path.join(tmp, "target")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        out = run([sys.executable, "-m", "pip", "install", "--no-index",
                   "--no-build-isolation", "--target", target, src], env=env)
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        self.assertTrue(os.path.isfile(os.path.join(target, "shmbroker", "client.py")))
        dist = [d for d in os.listdir(target) if d.endswith(".dist-info")]
        self.assertEqual(len(dist), 1, dist)
        self.assertTrue(dist[0].startswith("shmbroker-"))
        out = run([sys.executable, "-c", "import shmbroker; print(shmbroker.__file__)"],
                  env=dict(os.environ, PYTHONPATH=target), cwd=tmp)
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        self.assertTrue(out.stdout.decode().startswith(target))
