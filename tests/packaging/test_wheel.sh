#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# 'make wheel' gives build/dist/shmbroker-VERSION-py3-none-any.whl, and the
# documented route works with no network: a fresh venv, pip install of the
# wheel with --no-index (in a network namespace of its own when root), then
# a put and a get against a daemon, the package imported from the venv.
. "$(dirname "$0")/lib.sh"

PY="${PYTHON:-/usr/bin/python3}"
version=$(tmake -s print-version) || { fail "make print-version"; exit 1; }
whl="$build/dist/shmbroker-$version-py3-none-any.whl"
rm -f "$whl"
if tmake wheel >"$tmp/make.log" 2>&1 && [ -f "$whl" ] &&
    "$PY" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None' "$whl"; then
    pass "make_wheel ($(basename "$whl"))"
else
    cat "$tmp/make.log"
    fail "make_wheel: no $whl"
    exit 1
fi

# No network: a namespace with only a loopback, when we may make one.
offline=""
if [ "$(id -u)" -eq 0 ] && unshare --net true 2>/dev/null; then
    offline="unshare --net"
fi
if ! "$PY" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
    cat "$tmp/venv.log"
    fail "venv: $PY -m venv failed (Debian: apt-get install python3-venv)"
    exit 1
fi
if env -u PYTHONPATH PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 \
    $offline "$tmp/venv/bin/pip" install --no-index --no-cache-dir "$whl" >"$tmp/pip.log" 2>&1; then
    pass "pip_install_offline${offline:+ (in a network namespace of its own)}"
else
    cat "$tmp/pip.log"
    fail "pip_install_offline: $tmp/venv/bin/pip install --no-index $whl"
    exit 1
fi

start_daemon || { fail "the test daemon did not start"; exit 1; }
cd "$tmp" || exit 1
if out=$(env -u PYTHONPATH SHMBROKER_SOCKET="$tmp/sock" "$tmp/venv/bin/python" -I -c '
import importlib.metadata as md, shmbroker, sys
assert shmbroker.__file__.startswith(sys.prefix), shmbroker.__file__
assert md.version("shmbroker") == sys.argv[1], md.version("shmbroker")
eps = md.entry_points(group="vllm.general_plugins")
assert [e.value for e in eps if e.name == "shmbroker"] == ["shmbroker.vllm_plugin:register"], eps
with shmbroker.Client() as c:
    c.put("wheel-greeting", b"from the wheel")
    with c.get("wheel-greeting") as pin:
        print(bytes(pin.view).decode())
' "$version" 2>&1) && [ "$out" = "from the wheel" ]; then
    pass "venv_put_get"
else
    echo "$out"
    fail "venv_put_get: import and put/get from the venv"
fi

# README's Python example, as a newcomer runs it right after README's venv
# commands: with the venv's python alone (-I: no system site-packages, so no
# numpy unless the wheel brought it), and printing what README says it prints.
"$PY" -c '
import sys
sys.path.insert(0, sys.argv[1])
import doc_examples
b = [b for b in doc_examples.runnable(["README.md"]) if b.kind == "python"][0]
open(sys.argv[2] + "/readme.py", "w").write(b.text)
open(sys.argv[2] + "/readme.out", "w").write(b.expected or "")
' "$root/tests/python" "$tmp" || fail "readme_example_in_venv: no Python example in README.md"
if out=$(env -u PYTHONPATH SHMBROKER_SOCKET="$tmp/sock" "$tmp/venv/bin/python" -I readme.py 2>&1) &&
    [ "$out" = "$(cat readme.out)" ]; then
    pass "readme_example_in_venv"
else
    echo "$out"
    fail "readme_example_in_venv: README's Python example in the venv README makes"
fi

# The wheel's RECORD lists every file it installed: pip removes them all.
site=$("$tmp/venv/bin/python" -I -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if "$tmp/venv/bin/pip" uninstall -y shmbroker >"$tmp/pip.log" 2>&1 &&
    [ ! -e "$site/shmbroker" ] && ! ls -d "$site"/shmbroker-* >/dev/null 2>&1; then
    pass "pip_uninstall"
else
    cat "$tmp/pip.log"
    ls "$site"
    fail "pip_uninstall: files of the wheel left in $site"
fi

[ "$fails" -eq 0 ]
