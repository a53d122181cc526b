# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin (shmbroker.vllm_plugin) and the recorded vLLM interfaces
(shmbroker._vllm_interfaces).

The plugin runs in a stand-in vLLM (vllm_plugin_standin/: vLLM's module
paths, a plugins module that loads the vllm.general_plugins entry points
through importlib.metadata, vLLM's classes with their interfaces but none of
their work, modules that take those classes by name), in a child process
whose sys.path has a temporary directory with the package's dist-info and
its entry_points.txt, made from client/python/pyproject.toml. The same
declaration is checked in what `make install` installs.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import support
from shmbroker import _vllm_interfaces as vi

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "vllm_plugin_standin")
PYPROJECT = os.path.join(support.PACKAGE_DIR, "pyproject.toml")
GROUP = "vllm.general_plugins"
LOGGER = "vllm.plugins.shmbroker"

# What the child process does: take MessageQueue by name (parallel_state)
# before vLLM loads its plugins, load them, import the other modules that
# take the classes by name, and report which class each name holds; with
# "use", make a store and a queue through the names vLLM's modules hold and
# pass an object through each.
PROBE = r'''
import importlib, json, logging, os, subprocess, sys, threading
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(name)s: %(message)s")
import vllm.distributed.parallel_state as ps
from vllm.plugins import load_general_plugins
out = {}
try:
    load_general_plugins()
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
def where(module, name):
    try:
        return getattr(importlib.import_module("vllm." + module), name).__module__
    except ImportError:
        return "absent"
out["classes"] = {
    "%s.%s" % (module.rsplit(".", 1)[-1], name): where(module, name)
    for module, name in [("distributed.device_communicators.shm_broadcast", "MessageQueue"),
                         ("distributed.parallel_state", "MessageQueue"),
                         ("v1.executor.multiproc_executor", "MessageQueue"),
                         ("distributed.device_communicators.shm_object_storage",
                          "SingleWriterShmRingBuffer"),
                         ("distributed.device_communicators.shm_object_storage",
                          "SingleWriterShmObjectStorage"),
                         ("multimodal.cache", "SingleWriterShmRingBuffer"),
                         ("multimodal.cache", "SingleWriterShmObjectStorage")]}
out["socket"] = os.environ.get("SHMBROKER_SOCKET")
if sys.argv[1] == "use" and "error" not in out:
    import vllm.multimodal.cache as mm
    from shmbroker.vllm import PickleSerde
    store = mm.sender_store("plugin-test-%d" % os.getpid(), 1 << 20, 1 << 16, 1, PickleSerde)
    address, monotonic_id = store.put("key", {"a": [1, 2, 3]})
    out["store_get"] = store.get(address, monotonic_id)
    writer = ps.make_broadcaster(1, 1 << 20, 2)
    got = []
    def read(handle):
        reader = ps.MessageQueue.create_from_handle(handle, 0)
        reader.wait_until_ready()
        got.append(reader.dequeue(timeout=30))
        reader.close()
    t = threading.Thread(target=read, args=(writer.export_handle(),))
    t.start()
    writer.wait_until_ready()
    writer.enqueue(["hello", 1])
    t.join()
    writer.close()
    store.close()
    out["queue_got"] = got
    import shmbroker
    with shmbroker.Client(os.environ["SHMBROKER_SOCKET"]) as c:
        out["daemon_size"] = c.info["size"]
    out["child_socket"] = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('SHMBROKER_SOCKET'))"],
        stdout=subprocess.PIPE, check=True).stdout.decode().strip()
    import shmbroker.vllm_plugin
    shmbroker.vllm_plugin.register()  # a second call in the process: nothing more
print(json.dumps(out))
'''

STANDIN_MODULES = {"vllm.distributed.device_communicators.shm_broadcast",
                   "vllm.distributed.device_communicators.shm_object_storage",
                   "vllm.multimodal.cache", "vllm.distributed.parallel_state",
                   "vllm.v1.executor.multiproc_executor"}


def declared_entry_points():
    """[(group, name, value)] of client/python/pyproject.toml's
    [project.entry-points."..."] tables."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the few lines are simple enough
        out, group = [], None
        with open(PYPROJECT, encoding="utf-8") as f:
            for line in f:
                m = re.match(r'\[project\.entry-points\."([^"]+)"\]', line.strip())
                if m:
                    group = m.group(1)
                elif line.startswith("["):
                    group = None
                elif group and "=" in line and not line.lstrip().startswith("#"):
                    name, value = line.split("=", 1)
                    out.append((group, name.strip(), value.strip().strip('"')))
        return out
    with open(PYPROJECT, "rb") as f:
        data = tomllib.load(f)
    return [(g, n, v) for g, eps in data["project"].get("entry-points", {}).items()
            for n, v in eps.items()]


def make_dist_info(site):
    """A dist-info in site declaring the package's entry points, as pip
    would install it."""
    info = os.path.join(site, "shmbroker-0.1.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: shmbroker\nVersion: 0.1.0\n")
    groups = {}
    for group, name, value in declared_entry_points():
        groups.setdefault(group, []).append("%s = %s" % (name, value))
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        for group, lines in groups.items():
            f.write("[%s]\n%s\n\n" % (group, "\n".join(lines)))


class PluginTest(unittest.TestCase):
    """A daemon on a temporary socket and a temporary site directory."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="shmb-plugin-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.site = os.path.join(self.tmp, "site")
        os.makedirs(self.site)
        make_dist_info(self.site)
        self.d = support.Daemon("8M").start()
        self.addCleanup(self.d.cleanup)

    def run_probe(self, env, mode="look", standin=STANDIN, with_plugin=True):
        """The child's report (a dict) and its stderr."""
        e = {k: v for k, v in os.environ.items()
             if k not in ("SHMBROKER_VLLM", "SHMBROKER_SOCKET", "SHMBROKER_VLLM_SIZE",
                          "VLLM_PLUGINS")}
        path = ([self.site] if with_plugin else []) + [standin, support.PACKAGE_DIR]
        e["PYTHONPATH"] = os.pathsep.join(path)
        e["SHMBROKERD"] = support.daemon_binary()
        e.update(env)
        p = subprocess.run([sys.executable, "-c", PROBE, mode], env=e, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120, cwd=self.tmp)
        err = p.stderr.decode()
        self.assertEqual(p.returncode, 0, err)
        return json.loads(p.stdout.decode().strip().splitlines()[-1]), err

    def assert_standin(self, out):
        for where, module in out["classes"].items():
            self.assertIn(module, STANDIN_MODULES, where)

    def assert_switched(self, out):
        for where, module in out["classes"].items():
            want = "shmbroker.queue" if where.endswith("MessageQueue") else "shmbroker.vllm"
            self.assertEqual(module, want, where)

    def plugin_lines(self, err):
        return [line for line in err.splitlines() if line.startswith("LOG " + LOGGER)]


class TestPlugin(PluginTest):
    # Without SHMBROKER_VLLM (or with 0) the plugin is loaded and changes
    # nothing: every name holds the stand-in's class, nothing is logged.
    def test_without_the_variable_nothing_changes(self):
        for env in ({"SHMBROKER_SOCKET": self.d.socket_path},
                    {"SHMBROKER_VLLM": "0", "SHMBROKER_SOCKET": self.d.socket_path}):
            out, err = self.run_probe(env)
            self.assertNotIn("error", out)
            self.assert_standin(out)
            self.assertEqual(self.plugin_lines(err), [])

    # With the variable but without the package's entry point nothing
    # changes either: the switch is the plugin's doing.
    def test_without_the_entry_point_nothing_changes(self):
        out, err = self.run_probe({"SHMBROKER_VLLM": "1", "SHMBROKER_SOCKET": self.d.socket_path},
                                  with_plugin=False)
        self.assertNotIn("error", out)
        self.assert_standin(out)

    # SHMBROKER_VLLM=1 with a daemon at $SHMBROKER_SOCKET: every name vLLM's
    # modules hold (taken before the plugins ran, or after) is shmbroker's
    # class; a store and a queue made through them carry objects through
    # the daemon; one log line names what was replaced, the importers
    # changed and the daemon, and a second register() adds none.
    def test_switches_over_with_a_daemon(self):
        out, err = self.run_probe({"SHMBROKER_VLLM": "1", "SHMBROKER_SOCKET": self.d.socket_path},
                                  mode="use")
        self.assertNotIn("error", out, err)
        self.assert_switched(out)
        self.assertEqual(out["store_get"], {"a": [1, 2, 3]})
        self.assertEqual(out["queue_got"], [["hello", 1]])
        self.assertEqual(out["socket"], self.d.socket_path)
        lines = self.plugin_lines(err)
        self.assertEqual(len(lines), 1, err)
        for word in ("shm_broadcast.MessageQueue", "SingleWriterShmRingBuffer",
                     "SingleWriterShmObjectStorage", "vllm.distributed.parallel_state.MessageQueue",
                     self.d.socket_path, "shared"):
            self.assertIn(word, lines[0])

    # SHMBROKER_VLLM=<socket path> names the daemon, whatever
    # $SHMBROKER_SOCKET said, and the processes started after use it too.
    def test_a_socket_path_names_the_daemon(self):
        out, err = self.run_probe({"SHMBROKER_VLLM": self.d.socket_path,
                                   "SHMBROKER_SOCKET": os.path.join(self.tmp, "none.sock")},
                                  mode="use")
        self.assertNotIn("error", out, err)
        self.assert_switched(out)
        self.assertEqual(out["socket"], self.d.socket_path)
        self.assertEqual(out["child_socket"], self.d.socket_path)
        self.assertEqual(out["queue_got"], [["hello", 1]])

    # SHMBROKER_VLLM=1 when no daemon answers: the first process starts a
    # private one of $SHMBROKER_VLLM_SIZE, its children are told its socket,
    # and it stops once that process has exited.
    def test_a_private_daemon_when_none_answers(self):
        out, err = self.run_probe({"SHMBROKER_VLLM": "1", "SHMBROKER_VLLM_SIZE": "16M",
                                   "SHMBROKER_SOCKET": os.path.join(self.tmp, "none.sock")},
                                  mode="use")
        self.assertNotIn("error", out, err)
        self.assert_switched(out)
        private = out["socket"]
        self.assertNotEqual(private, os.path.join(self.tmp, "none.sock"))
        self.assertEqual(out["child_socket"], private)
        self.assertEqual(out["daemon_size"], 16 << 20)
        self.assertEqual(out["store_get"], {"a": [1, 2, 3]})
        self.assertEqual(out["queue_got"], [["hello", 1]])
        lines = self.plugin_lines(err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn(private, lines[0])
        self.assertIn("private", lines[0])
        deadline = time.monotonic() + 30
        while os.path.exists(private) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(os.path.exists(private), "the private daemon outlived its process")

    # A socket path where nothing answers is refused with its path, and so
    # is a value the plugin does not understand: vLLM stops, nothing is
    # replaced silently or half.
    def test_refuses_a_daemon_that_does_not_answer_and_a_bad_value(self):
        none = os.path.join(self.tmp, "none.sock")
        out, _ = self.run_probe({"SHMBROKER_VLLM": none})
        self.assertTrue(out["error"].startswith("RuntimeError"), out)
        self.assertIn(none, out["error"])
        self.assert_standin(out)
        out, _ = self.run_probe({"SHMBROKER_VLLM": "maybe"})
        self.assertTrue(out["error"].startswith("ValueError"), out)
        self.assertIn("SHMBROKER_VLLM='maybe'", out["error"])
        self.assert_standin(out)

    def changed_standin(self, path, old, new):
        """A copy of the stand-in with old replaced by new in path (None:
        the file removed)."""
        copy = os.path.join(self.tmp, "standin")
        shutil.copytree(STANDIN, copy, ignore=shutil.ignore_patterns("__pycache__"))
        target = os.path.join(copy, "vllm", *path.split("/"))
        if new is None:
            os.unlink(target)
            return copy
        with open(target) as f:
            text = f.read()
        self.assertIn(old, text)
        with open(target, "w") as f:
            f.write(text.replace(old, new))
        return copy

    # A vLLM whose interfaces differ from the recorded ones (a parameter
    # gone, a method added, a module missing) makes the plugin raise,
    # naming the difference, and replace nothing.
    def test_refuses_other_interfaces(self):
        cases = [
            ("distributed/device_communicators/shm_broadcast.py",
             "def dequeue(self, timeout=None, cancel=None, indefinite=False):",
             "def dequeue(self, timeout=None, cancel=None):",
             "MessageQueue.dequeue is (self, timeout=None, cancel=None), recorded "
             "(self, timeout=None, cancel=None, indefinite=False)"),
            ("distributed/device_communicators/shm_object_storage.py",
             "    def free_unused(self):",
             "    def peek(self, key):\n        pass\n\n    def free_unused(self):",
             "SingleWriterShmObjectStorage.peek(self, key) is new"),
            ("distributed/device_communicators/shm_broadcast.py",
             "    @staticmethod\n    def recv(socket, timeout):",
             "    def recv(self, socket, timeout):",
             "MessageQueue.recv is (self, socket, timeout), recorded static (socket, timeout)"),
            ("distributed/device_communicators/shm_object_storage.py", None, None,
             "cannot be imported"),
        ]
        # (No subTest: tests/python/run.py counts tests, not subtests.)
        for path, old, new, says in cases:
            standin = self.changed_standin(path, old, new)
            out, err = self.run_probe({"SHMBROKER_VLLM": "1",
                                       "SHMBROKER_SOCKET": self.d.socket_path},
                                      standin=standin)
            self.assertIn("error", out, says + "\n" + err)
            self.assertTrue(out["error"].startswith("RuntimeError"), out["error"])
            self.assertIn(says, out["error"])
            self.assertEqual(self.plugin_lines(err), [])
            for where in ("shm_broadcast.MessageQueue", "parallel_state.MessageQueue"):
                self.assertIn(out["classes"][where], STANDIN_MODULES, says)
            self.assertIn(out["classes"]["shm_object_storage.SingleWriterShmObjectStorage"],
                          STANDIN_MODULES | {"absent"}, says)
            shutil.rmtree(standin)


class TestRecordedInterfaces(unittest.TestCase):
    # Our drop-ins take every call vLLM's classes take, method by method, as
    # recorded: each difference is listed.
    def test_dropins_take_every_call_vllms_take(self):
        problems = []
        for key in vi.CLASSES:
            problems += vi.dropin_differences(key)
        self.assertEqual(problems, [], "\n" + "\n".join(problems))

    # The check sees what a caller of vLLM's class would trip on: a missing
    # method, a renamed or missing parameter, a required extra parameter, a
    # different constant default, an instance method where vLLM's is static;
    # and accepts extras that have defaults or are keyword-only.
    def test_the_check_sees_each_kind_of_difference(self):
        key = ("vllm.distributed.device_communicators.shm_broadcast", "MessageQueue")

        def with_changes(**changes):
            body = {}
            for name, text in vi.CLASSES[key]["methods"].items():
                static = text.startswith("static ")
                params = text[len("static "):] if static else text
                src = "def %s%s: pass" % (name, params.replace("=...", "=None"))
                scope = {}
                exec(src, scope)
                body[name] = staticmethod(scope[name]) if static else scope[name]
            for name, src in changes.items():
                if src is None:
                    del body[name]
                else:
                    scope = {}
                    exec(src, scope)
                    body[name] = scope[name]
            return type("Q", (), body)

        self.assertEqual(vi.dropin_differences(key, with_changes()), [])
        ok = with_changes(dequeue="def dequeue(self, timeout=None, cancel=None, indefinite="
                                  "False, spin=0, *, name=None, **kw): pass",
                          enqueue="def enqueue(self, obj=None, timeout=None): pass")
        self.assertEqual(vi.dropin_differences(key, ok), [])
        bad = {
            "is missing": dict(shutdown=None),
            "lacks parameter 'indefinite'":
                dict(dequeue="def dequeue(self, timeout=None, cancel=None): pass"),
            "has 'event' where vLLM has 'cancel'":
                dict(dequeue="def dequeue(self, timeout=None, event=None, indefinite=False): "
                             "pass"),
            "requires parameter 'flags'":
                dict(enqueue="def enqueue(self, obj, timeout=None, *, flags): pass"),
            "has 'flags' where vLLM has 'timeout'":
                dict(enqueue="def enqueue(self, obj, flags, timeout=None): pass"),
            "max_chunks defaults to 8":
                dict(__init__="def __init__(self, n_reader, n_local_reader, local_reader_ranks="
                              "None, max_chunk_bytes=25165824, max_chunks=8, connect_ip=None): "
                              "pass"),
            "requires timeout":
                dict(acquire_write="def acquire_write(self, timeout): pass"),
            "is not a staticmethod":
                dict(recv="def recv(socket, timeout): pass"),
        }
        for says, change in bad.items():
            problems = vi.dropin_differences(key, with_changes(**change))
            self.assertEqual(len(problems), 1, (says, problems))
            self.assertIn(says, problems[0])

    # Every recorded vLLM file names the commit its text was read at.
    def test_every_class_has_its_source(self):
        for module, _ in vi.CLASSES:
            path = module.replace(".", "/") + ".py"
            self.assertIn(path, vi.SOURCES)
            self.assertRegex(vi.SOURCES[path]["commit"], r"^[0-9a-f]{40}$")


@unittest.skipIf(shutil.which("make") is None, "make is absent")
class TestInstalledEntryPoint(unittest.TestCase):
    # make install puts a dist-info beside the package whose entry point is
    # the one pyproject.toml declares, so importlib.metadata (and vLLM)
    # finds the plugin; make uninstall removes it.
    def test_make_install_declares_the_plugin(self):
        self.assertIn((GROUP, "shmbroker", "shmbroker.vllm_plugin:register"),
                      declared_entry_points())
        tmp = tempfile.mkdtemp(prefix="shmb-plugin-install-")
        self.addCleanup(shutil.rmtree, tmp, True)
        make = ["make", "--no-print-directory", "-C", support.ROOT, "DESTDIR=" + tmp,
                "PREFIX=/usr/local", "PYTHON=" + sys.executable,
                "PYTHONDIR=/usr/local/lib/python3/dist-packages"]
        if os.environ.get("SHMB_BUILD_DIR"):
            make.append("BUILD=" + os.environ["SHMB_BUILD_DIR"])
        out = subprocess.run(make + ["install"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        site = os.path.join(tmp, "usr", "local", "lib", "python3", "dist-packages")
        code = ("import json; from importlib.metadata import entry_points, version; "
                "print(json.dumps([version('shmbroker')] + [[e.group, e.name, e.value] for e in "
                "entry_points(group=%r)]))" % GROUP)
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=site),
                             cwd=tmp)
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        found = json.loads(out.stdout.decode())
        self.assertEqual(found[0], support.shmbroker.__version__)
        self.assertEqual([tuple(e) for e in found[1:]],
                         [e for e in declared_entry_points() if e[0] == GROUP])
        out = subprocess.run(make + ["uninstall"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        self.assertEqual(out.returncode, 0, out.stdout.decode())
        self.assertEqual([d for d in os.listdir(site) if d.startswith("shmbroker")], [])


if __name__ == "__main__":
    unittest.main()
