#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Every source file of the tree carries the project's license line: the C
# and Python sources, the scripts, the build files, the units and the man
# pages (data files, docs and Debian's packaging lists are left out).
# Run from the top of the tree; prints PASS or FAIL, exits 1 on a miss.
cd "$(dirname "$0")/../.." || exit 1
fail=0
n=0
for f in $(git ls-files 2>/dev/null || find . -type f | sed 's,^\./,,'); do
    case "$f" in
        *.c|*.h|*.def|*.map|*.py|*.sh|*.1|*.8|Makefile|.ci/run|*.in|*.conf|*.default|\
        *.sysusers|*.toml|debian/rules) ;;
        *) continue ;;
    esac
    n=$((n + 1))
    if ! head -n 3 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0'; then
        echo "FAIL: $f has no 'SPDX-License-Identifier: Apache-2.0' in its first 3 lines"
        fail=1
    fi
done
[ -f LICENSE ] || { echo "FAIL: LICENSE is missing"; fail=1; }
[ "$fail" = 0 ] && echo "PASS: $n source files carry the Apache-2.0 SPDX line; LICENSE is there"
exit $fail
