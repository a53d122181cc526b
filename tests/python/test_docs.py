# SPDX-License-Identifier: Apache-2.0
"""README.md and docs/: their examples run, in reading order, against one
daemon; they mention every option of the daemon and the ctl and every public
Python call; their links resolve.

The examples are the blocks doc_examples.py marks; each is a test of its
own, named after its page and line, run in order (a later example may rely
on what an earlier one did, as a reader's would).
"""

import inspect
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

import doc_examples
import support
from support import ROOT

import shmbroker

# Bounds on one example, far above what each takes (a second or two).
EXAMPLE_TIMEOUT = 120


def ctl_binary():
    """The shmbrokerctl beside the daemon under test."""
    path = os.environ.get("SHMBROKERCTL") or os.path.join(
        os.path.dirname(support.daemon_binary()), "shmbrokerctl")
    return os.path.abspath(path)


def build_dir():
    """Where make put the daemon, the ctl and the examples' programs."""
    return os.path.dirname(support.daemon_binary())


def all_text():
    """README.md and every page of docs/, joined."""
    parts = []
    for page in pages_present():
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            parts.append(f.read())
    return "\n".join(parts)


def pages_present():
    """README.md and the pages in docs/, as paths relative to ROOT."""
    docs = sorted("docs/" + n for n in os.listdir(os.path.join(ROOT, "docs"))
                  if n.endswith(".md"))
    return ["README.md"] + docs


def code_spans(text):
    """The text of every inline code span and fenced block."""
    spans = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    spans += re.findall(r"`([^`\n]+)`", prose)
    return spans


def long_options(help_text):
    """The long options a --help text lists (its own lines' first words and
    the options inside usage lines)."""
    return sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", help_text)))


def mentions_option(text, opt):
    """Whether text names --opt as a whole word (not --opt-more)."""
    return re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(opt), text) is not None


def anchors(text):
    """The anchors GitHub makes of a page's headings (duplicates get -1, -2)."""
    seen = {}
    out = set()
    fence = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#{1,6} (.*)$", line)
        if not m:
            continue
        a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else "%s-%d" % (a, n))
    return out


def links(text):
    """The targets of a page's Markdown links, outside code."""
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return re.findall(r"\]\(([^)\s]+)\)", prose)


class TestDocsMention(unittest.TestCase):
    """The docs keep up with the code: what --help and the package offer is
    written down somewhere a reader looks."""

    @classmethod
    def setUpClass(cls):
        cls.text = all_text()
        cls.spans = code_spans(cls.text)

    def help_of(self, binary):
        r = subprocess.run([binary, "--help"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30)
        self.assertEqual(r.returncode, 0, "%s --help failed" % binary)
        return r.stdout.decode("utf-8", "replace")

    # Every long option of shmbrokerd --help is named in README or docs/.
    def test_daemon_options_documented(self):
        opts = long_options(self.help_of(support.daemon_binary()))
        self.assertGreater(len(opts), 20, "shmbrokerd --help listed too few options: %r" % opts)
        missing = [o for o in opts if not mentions_option(self.text, o)]
        self.assertEqual(missing, [], "shmbrokerd options that README.md and docs/*.md never "
                         "name; document them (docs/operations.md, The daemon)")

    # Every command and long option of shmbrokerctl --help is named.
    def test_ctl_commands_documented(self):
        text = self.help_of(ctl_binary())
        commands = re.search(r"^Commands:\n(.*?)\n\n", text, flags=re.S | re.M)
        self.assertIsNotNone(commands, "shmbrokerctl --help has no 'Commands:' block")
        names = re.findall(r"^  ([a-z]+)\b", commands.group(1), flags=re.M)
        self.assertGreaterEqual(len(names), 7, "too few commands found: %r" % names)
        # A command is documented when some code span is it, with its
        # arguments, or is a shmbrokerctl command line that runs it.
        form = r"^(?:\S*shmbrokerctl(?:\s+--?[\w-]+(?:\s+[^\s-]\S*)?)*\s+)?%s(?:\s|$)"
        missing = [n for n in names
                   if not any(re.search(form % n, s.strip(), flags=re.M) for s in self.spans)]
        self.assertEqual(missing, [], "shmbrokerctl commands no code span in README.md or "
                         "docs/*.md shows")
        missing = [o for o in long_options(text) if not mentions_option(self.text, o)]
        self.assertEqual(missing, [], "shmbrokerctl options never named in the docs")

    def _public_callables(self):
        """(label, name, object) for every public name of the package and the
        public methods of its classes (those of the package's own classes,
        not of list or the built-in exceptions)."""
        out = []
        for name in shmbroker.__all__:
            obj = getattr(shmbroker, name)
            out.append((name, name, obj))
            if inspect.ismodule(obj):
                for sub in getattr(obj, "__all__", []):
                    out.append(("%s.%s" % (name, sub), sub, getattr(obj, sub)))
            elif inspect.isclass(obj):
                for klass in obj.__mro__:
                    if not klass.__module__.startswith("shmbroker"):
                        continue
                    for attr, value in vars(klass).items():
                        if not attr.startswith("_"):
                            out.append(("%s.%s" % (name, attr), attr, value))
        return out

    @staticmethod
    def _parameters(obj):
        """The parameter names a caller may pass, or None when obj is not
        something one calls with a signature of the package's own."""
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if inspect.isclass(obj):
            # A class's own constructor only: NoSpace is documented by
            # ShmBrokerError(code, message), whose constructor it takes.
            if "__init__" not in vars(obj) and "__dataclass_fields__" not in vars(obj):
                return None
        elif not inspect.isfunction(obj):
            return None
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            return None
        return [p.name for p in sig.parameters.values()
                if p.name not in ("self", "cls") and p.kind != p.POSITIONAL_ONLY]

    # Every public name, method and attribute of the package is named in a
    # code span, and every parameter of each call in a span that calls it:
    # a renamed or added parameter (Client's pool=) cannot go unwritten.
    def test_python_signatures_documented(self):
        missing_names = []
        missing_params = []
        for label, name, obj in self._public_callables():
            if not any(re.search(r"(?<![\w])%s(?![\w])" % re.escape(name), s)
                       for s in self.spans):
                missing_names.append(label)
                continue
            params = self._parameters(obj)
            if not params:
                continue
            calls = [s for s in self.spans if re.search(r"(?<![\w])%s\(" % re.escape(name), s)]
            for p in params:
                if not any(re.search(r"(?<![\w])%s(?![\w])" % re.escape(p), c) for c in calls):
                    missing_params.append("%s(%s)" % (label, p))
        self.assertEqual(missing_names, [], "public names of the shmbroker package that no "
                         "code span of README.md or docs/*.md names")
        self.assertEqual(missing_params, [], "parameters no documented call of theirs shows "
                         "(docs/python.md, Reference)")


class TestDocsLinks(unittest.TestCase):
    """README is the way in to every page, and no link of theirs is broken."""

    # README links every page of docs/.
    def test_readme_links_every_page(self):
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            targets = {t.split("#")[0] for t in links(f.read())}
        missing = [p for p in pages_present()[1:] if p not in targets]
        self.assertEqual(missing, [], "pages of docs/ README.md does not link")

    # Every relative link of README and docs/ names a file that exists, and
    # an anchor its page has.
    def test_relative_links_resolve(self):
        broken = []
        for page in pages_present() + ["proto/PROTOCOL.md"]:
            with open(os.path.join(ROOT, page), encoding="utf-8") as f:
                text = f.read()
            for target in links(text):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # https:, mailto:
                path, _, anchor = target.partition("#")
                full = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) \
                    if path else os.path.join(ROOT, page)
                if not os.path.exists(full):
                    broken.append("%s: %s (no such file)" % (page, target))
                    continue
                if anchor and full.endswith(".md"):
                    with open(full, encoding="utf-8") as f:
                        if anchor not in anchors(f.read()):
                            broken.append("%s: %s (no such heading)" % (page, target))
        self.assertEqual(broken, [])

    # Each page of docs/ starts with its contents: a link to each of its
    # sections, before the first of them.
    def test_pages_have_contents(self):
        bad = []
        for page in pages_present()[1:]:
            with open(os.path.join(ROOT, page), encoding="utf-8") as f:
                text = f.read()
            first = re.search(r"^## ", text, flags=re.M)
            head = text[:first.start()] if first else text
            want = anchors("\n".join(l for l in text.split("\n") if l.startswith("## ")))
            have = {t[1:] for t in links(head) if t.startswith("#")}
            if not first or want - have:
                bad.append("%s: contents lack %s" % (page, sorted(want - have) or "sections"))
        self.assertEqual(bad, [])

    # README stays a guide a newcomer reads in ten minutes.
    def test_readme_is_short(self):
        with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
            n = f.read().count("\n")
        self.assertLessEqual(n, 300, "README.md has %d lines: move detail to docs/" % n)

    # Every page of docs/ has its place in the examples' order.
    def test_every_page_in_example_order(self):
        self.assertEqual(sorted(doc_examples.PAGES), sorted(pages_present()))


class TestDocExamples(unittest.TestCase):
    """The marked examples, run in reading order against one daemon, as a
    newcomer would run them one after the other (test methods are added
    below, one per example, numbered in that order)."""

    @classmethod
    def setUpClass(cls):
        cls.d = support.Daemon(size="128M").start()
        cls.work = tempfile.mkdtemp(prefix="shmb-docs-")
        # The examples say build/shmbrokerctl, from the top of the tree: here
        # build/ is the build directory under test.
        os.symlink(build_dir(), os.path.join(cls.work, "build"))

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()
        shutil.rmtree(cls.work, ignore_errors=True)

    def env(self):
        env = dict(os.environ)
        env["SHMBROKER_SOCKET"] = self.d.socket_path
        env["SHMBROKERD"] = support.daemon_binary()
        env["PYTHONPATH"] = support.PACKAGE_DIR + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        return env

    def run_block(self, b):
        if os.environ.get("SHMB_SANITIZER") and "-static" in b.text:
            # The sanitizers' runtimes cannot be linked statically: the
            # plain build's run of make test runs this example.
            self.skipTest("%s links -static, which a SANITIZER=%s build cannot"
                          % (b.where(), os.environ["SHMB_SANITIZER"]))
        if b.kind == "sh":
            argv = ["sh", "-e", "-c", b.text]
        elif b.kind == "python":
            path = os.path.join(self.work, "example_%d.py" % b.line)
            with open(path, "w", encoding="utf-8") as f:
                f.write(b.text)
            argv = [sys.executable, path]
        else:  # c, excerpt: the page shows the source make built
            if b.kind == "c":
                self.assertEqual(b.text.rstrip("\n"), doc_examples.source_text(b.arg).rstrip("\n"),
                                 "%s shows %s, but not as it is: make them one again"
                                 % (b.where(), b.arg))
            else:
                line = doc_examples.excerpt_missing(b.text, b.arg)
                self.assertIsNone(line, "%s: the excerpt's line %r is not in %s (in order)"
                                  % (b.where(), line, b.arg))
            prog = os.path.join(build_dir(), doc_examples.binary_of(b.arg))
            self.assertTrue(os.access(prog, os.X_OK), "%s: %s is not built (make %s)"
                            % (b.where(), prog, prog))
            argv = [prog]
        # In a session of its own, so that a hung example's children (the
        # queue example's readers) go with it.
        proc = subprocess.Popen(argv, cwd=self.work, env=self.env(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=EXAMPLE_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            self.fail("%s (%s) did not end within %d s\nstdout:\n%s\nstderr:\n%s"
                      % (b.where(), b.kind, EXAMPLE_TIMEOUT, stdout.decode("utf-8", "replace"),
                         stderr.decode("utf-8", "replace")))
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what it left running
            except OSError:
                pass
        out = stdout.decode("utf-8", "replace")
        err = stderr.decode("utf-8", "replace")
        self.assertEqual(proc.returncode, 0, "%s (%s) exited %d\nstdout:\n%s\nstderr:\n%s\n"
                         "daemon log:\n%s" % (b.where(), b.kind, proc.returncode, out, err,
                                              self.d.log()[-3000:]))
        if b.expected is not None:
            self.assertEqual(out, b.expected, "%s printed other than the page shows" % b.where())


def _add_example_tests():
    try:
        examples = doc_examples.runnable()
    except (ValueError, OSError) as e:
        message = str(e)

        def test_marks(self):
            self.fail(message)
        TestDocExamples.test_000_marks = test_marks
        return
    for i, b in enumerate(examples, 1):
        def test(self, b=b):
            self.run_block(b)
        slug = re.sub(r"[^A-Za-z0-9]+", "_", b.page.replace(".md", ""))
        name = "test_%03d_%s_line_%d" % (i, slug, b.line)
        test.__name__ = name
        test.__doc__ = "%s: the %s example runs" % (b.where(), b.kind)
        setattr(TestDocExamples, name, test)
    # A docs tree whose examples all lost their marks would test nothing.
    if len(examples) < 5:
        def test_enough(self, n=len(examples)):
            self.fail("only %d marked examples in README.md and docs/" % n)
        TestDocExamples.test_000_enough = test_enough


_add_example_tests()


if __name__ == "__main__":
    unittest.main()
