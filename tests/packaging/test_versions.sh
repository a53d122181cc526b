#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# One version: the Makefile's VERSION. debian/changelog's newest entry (its
# upstream part), pyproject.toml and the package's __version__ must say the
# same, and 'make deb' refuses to build when the changelog does not.
. "$(dirname "$0")/lib.sh"

version=$(tmake -s print-version) || { fail "make print-version"; exit 1; }
case "$version" in
[0-9]*.[0-9]*) ;;
*) fail "the Makefile's VERSION '$version' is not a version"; exit 1 ;;
esac

# The first line: "shmbroker (0.1.0) unstable; ..." or "(0.1.0-1)".
deb=$(sed -n '1s/^[^(]*(\([^)]*\)).*/\1/p' "$root/debian/changelog")
upstream=${deb#*:}
upstream=${upstream%-*}
if [ "$upstream" = "$version" ]; then
    pass "changelog_version ($deb)"
else
    fail "changelog_version: debian/changelog's newest entry is $deb, the Makefile's VERSION $version (add an entry with dch -v $version)"
fi

py=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$root/client/python/pyproject.toml")
if [ "$py" = "$version" ]; then
    pass "pyproject_version"
else
    fail "pyproject_version: client/python/pyproject.toml says '$py', the Makefile $version"
fi

init=$(sed -n 's/^__version__ *= *"\([^"]*\)".*/\1/p' "$root/client/python/shmbroker/__init__.py")
if [ "$init" = "$version" ]; then
    pass "package_version"
else
    fail "package_version: shmbroker/__init__.py's __version__ is '$init', the Makefile $version"
fi

# make deb checks the changelog first: a copy of the tree whose changelog
# says another version must be refused before anything is built.
mkdir -p "$tmp/tree"
(cd "$root" && git ls-files -z 2>/dev/null | xargs -0 sh -c 'for f; do [ ! -e "$f" ] ||
    cp -P --parents "$f" "$0"/; done' "$tmp/tree") || cp -a "$root/." "$tmp/tree/"
sed -i "1s/([^)]*)/(9.9.9)/" "$tmp/tree/debian/changelog"
out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -C "$tmp/tree" \
    BUILD="$tmp/tree/build" deb-check-version 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && echo "$out" | grep -q "9.9.9" && echo "$out" | grep -q "$version" &&
    [ ! -d "$tmp/tree/build/debpkg" ]; then
    pass "deb_refuses_other_version"
else
    echo "$out"
    fail "deb_refuses_other_version: make deb-check-version with a 9.9.9 changelog (exit $rc)"
fi

[ "$fails" -eq 0 ]
