#!/bin/sh
# Puts Debian's jemalloc (libjemalloc2) in DIR for `make test`'s processes (LD_PRELOAD): fetched
# with `apt-get download` and unpacked there, nothing installed system-wide. Where it cannot be
# fetched, it says so and succeeds: the tests then run on glibc's malloc (slower, same results).
dir=$(realpath -m "$1")
tmp=$(mktemp -d) || exit 0
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 0
fetch() { apt-get download -q libjemalloc2 >/dev/null 2>&1; }
if ! fetch && ! { [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && fetch; }; then
    echo "jemalloc: apt-get could not fetch libjemalloc2; the tests run on glibc's malloc"
    exit 0
fi
dpkg-deb -x libjemalloc2_*.deb unpacked 2>/dev/null && mkdir -p "$dir" 2>/dev/null &&
    cp unpacked/usr/lib/*/libjemalloc.so.2 "$dir/" 2>/dev/null ||
    echo "jemalloc: could not unpack libjemalloc2; the tests run on glibc's malloc"
