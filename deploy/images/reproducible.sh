#!/usr/bin/env bash
# reproducible.sh NAME [REFERENCE_CACHE] — checks that the recipe NAME builds
# to the same image digest twice: two builds from scratch, each in a fresh
# cache of its own (nothing shared but the downloaded .deb files, which are
# the same package versions either way), compared by manifest digest.
#
# With REFERENCE_CACHE (e.g. /var/cache/kiln/images, where `make image`
# builds), one fresh build is compared with the archive already built there
# for the same recipe hash: the same check at half the cost, and across two
# builds made at different times. When the mirror published other versions
# of the image's packages since the reference was built, two fresh builds
# are compared instead. containerd is not touched.
#
# Prints both digests; exits 1 when they differ (and lists the files that
# differ between the two root filesystems).
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: reproducible.sh NAME [REFERENCE_CACHE]" >&2; exit 2; }
name=$1
ref_cache=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
debs=${KILN_IMAGE_CACHE:-/var/cache/kiln/images}/debs
work=$(mktemp -d /var/tmp/kiln-repro-XXXXXX)
trap 'rm -rf "$work"' EXIT

build() { # build CACHE_DIR → prints the digest
  mkdir -p "$1"
  if [ -d "$debs" ]; then cp -al "$debs" "$1/debs"; fi
  KILN_IMAGE_CACHE=$1 KILN_IMAGE_NO_IMPORT=1 bash "$here/build.sh" "$name" | tail -n1 | awk '{print $2}'
}

# packages ROOTFS → the image's installed packages, one name=version a line
packages() { dpkg-query --admindir="$1/var/lib/dpkg" -W -f '${Package}=${Version}\n' | sort; }

a=$(build "$work/a")
other=
if [ -n "$ref_cache" ]; then
  b=$(KILN_IMAGE_CACHE=$ref_cache KILN_IMAGE_NO_IMPORT=1 bash "$here/build.sh" "$name" | tail -n1 | awk '{print $2}')
  # The reference is the cached build of the same recipe hash as the
  # fresh one (the cache may hold builds of other recipes, newer ones too).
  other=$ref_cache/$(basename "$(ls -d "$work/a/$name"-*/)")
  # The recipe names packages, not versions: a mirror that published an
  # update since the reference was built gives the fresh build another
  # version. That is the archive moving, not the build leaking its host or
  # its time, and the old version may be gone from the mirror: compare two
  # fresh builds instead.
  if ! moved=$(diff <(packages "$other/rootfs") <(packages "$(ls -d "$work/a/$name"-*/)rootfs")); then
    echo "reproducible.sh: $name: the mirror moved since the reference was built (< reference, > now):"
    echo "$moved" | grep '^[<>]' | head -n 20
    echo "reproducible.sh: $name: comparing two fresh builds instead"
    other=
  fi
fi
if [ -z "$other" ]; then
  b=$(build "$work/b")
  other=$(ls -d "$work/b/$name"-*/)
fi
echo "reproducible.sh: $name: first build $a, second build $b"
if [ -z "$a" ] || [ "$a" != "$b" ]; then
  echo "reproducible.sh: $name: the digests differ; files that differ:" >&2
  diff -rq --no-dereference "$(ls -d "$work/a/$name"-*/)rootfs" "$other/rootfs" 2>&1 | head -n 40 >&2 || true
  exit 1
fi
echo "reproducible.sh: $name: same digest"
