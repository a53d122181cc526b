#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The API reference: client/libshmbroker.3 is what scripts/gen_man3.py
# writes from shmbroker.h today (run 'make man3' after changing the header),
# names every public function, renders without warnings; make install puts it
# and the Python package's reference (pydoc's text) in place.
. "$(dirname "$0")/lib.sh"

PY="${PYTHON:-/usr/bin/python3}"
version=$(tmake -s print-version) || { fail "make print-version"; exit 1; }
page="$root/client/libshmbroker.3"

if "$PY" "$root/scripts/gen_man3.py" "$version" "$root/client/shmbroker.h" >"$tmp/new.3" &&
    diff -u "$page" "$tmp/new.3" >"$tmp/diff"; then
    pass "man3_in_step"
else
    head -n 40 "$tmp/diff"
    fail "man3_in_step: client/libshmbroker.3 is not what shmbroker.h gives: run 'make man3'"
fi

missing=""
for f in $(sed -n 's/^[a-z].*[ *]\(shmb_[a-z0-9_]*\)(.*/\1/p' "$root/client/shmbroker.h" | sort -u); do
    grep -q "$f(" "$tmp/new.3" || missing="$missing $f"
done
if [ -z "$missing" ]; then
    pass "man3_names_every_function"
else
    fail "man3_names_every_function: missing$missing"
fi

if command -v man >/dev/null 2>&1; then
    warn=$(MANWIDTH=80 man --warnings -l "$tmp/new.3" 2>&1 >/dev/null)
    if [ -z "$warn" ]; then
        pass "man3_renders"
    else
        echo "$warn" | head -n 20
        fail "man3_renders: man printed warnings"
    fi
else
    echo "SKIP: man3_renders (no man here)"
fi

if tmake install PREFIX=/usr DESTDIR="$tmp/stage" >"$tmp/install.log" 2>&1 &&
    [ -s "$tmp/stage/usr/share/man/man3/libshmbroker.3" ] &&
    grep -q "class Client" "$tmp/stage/usr/share/doc/shmbroker/python-reference.txt" &&
    grep -q "class MessageQueue" "$tmp/stage/usr/share/doc/shmbroker/python-reference.txt" &&
    ! grep -q "$root" "$tmp/stage/usr/share/doc/shmbroker/python-reference.txt" &&
    [ -s "$tmp/stage/usr/share/doc/shmbroker/README.md" ]; then
    pass "install_references"
else
    cat "$tmp/install.log"
    ls -R "$tmp/stage/usr/share" 2>/dev/null | head -n 30
    fail "install_references: make install did not put libshmbroker.3, python-reference.txt, README.md"
fi

[ "$fails" -eq 0 ]
