#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The package set of OLD_DIR again, with a higher version, in NEW_DIR: an
# upgrade for tests/systemd/checks-deb.sh without a second build. Each
# .deb is unpacked with dpkg-deb, its version gets the suffix +test2 (and
# so do the exact "(= VERSION)" dependencies between the packages), and it
# is packed again. The files, maintainer scripts and conffiles are the
# old ones.
# Usage: sh tests/systemd/deb-bump.sh OLD_DIR NEW_DIR
set -eu

if [ $# -ne 2 ]; then
    echo "usage: sh tests/systemd/deb-bump.sh OLD_DIR NEW_DIR" >&2
    exit 2
fi
old=$1
new=$2
suffix=+test2

mkdir -p "$new"
work=$(mktemp -d "${TMPDIR:-/tmp}/deb-bump.XXXXXX")
trap 'rm -rf "$work"' EXIT

n=0
for deb in "$old"/*.deb; do
    [ -e "$deb" ] || continue
    name=$(dpkg-deb -f "$deb" Package)
    version=$(dpkg-deb -f "$deb" Version)
    arch=$(dpkg-deb -f "$deb" Architecture)
    bumped="$version$suffix"
    # The version as a sed pattern: its dots (and any other special
    # character) taken literally.
    version_re=$(printf '%s' "$version" | sed 's/[].[*^$\/]/\\&/g')
    rm -rf "$work/tree"
    dpkg-deb -R "$deb" "$work/tree"
    # Version: and every "(= VERSION)" relation to a sibling package.
    sed -i -e "s/^Version: .*/Version: $bumped/" \
        -e "s/(= $version_re)/(= $bumped)/g" "$work/tree/DEBIAN/control"
    dpkg-deb --root-owner-group -Zgzip -b "$work/tree" \
        "$new/${name}_${bumped}_${arch}.deb" >/dev/null
    n=$((n + 1))
done
if [ "$n" -eq 0 ]; then
    echo "deb-bump: no .deb in $old" >&2
    exit 1
fi
echo "deb-bump: $n package(s) in $new with version suffix $suffix"
