#!/usr/bin/env bash
# build.sh NAME — builds the sandbox image described by deploy/images/NAME and
# makes it available to containerd as kiln.local/NAME:latest (and
# kiln.local/NAME:<recipe-hash-12>), unpacked for the snapshotter the worker
# uses, so the first container start does not pay for unpacking.
#
# The recipe hash is a SHA-256 over every file in the recipe folder (sorted
# names and contents). Work is skipped at two levels:
#   - containerd already has kiln.local/NAME:latest labelled with this hash and
#     unpacked: nothing to do;
#   - the OCI archive for this hash is in the cache: import it again.
# Otherwise the root filesystem is built from Debian packages with mmdebstrap,
# packed with umoci and imported with ctr.
#
# Cache layout, under ${KILN_IMAGE_CACHE:-/var/cache/kiln/images}:
#   NAME-<hash>/image.tar   OCI image archive (an OCI layout as a tar)
#   NAME-<hash>/rootfs/     the unpacked root filesystem (benchmarks chroot into it)
#   NAME.json               {"name","digest","recipe_sha256","rootfs"} of the current build
#   debs/                   downloaded .deb files, reused by the next build
#
# Environment (all optional):
#   KILN_IMAGE_CACHE          cache dir (above)
#   KILN_IMAGES_DIR           folder holding the recipes; default: this script's folder
#   KILN_CONTAINERD_ADDRESS   default /run/containerd/containerd.sock
#   KILN_CONTAINERD_NAMESPACE default kiln
#   KILN_SNAPSHOTTER          default overlayfs
#   KILN_IMAGE_NO_IMPORT      1: build (or reuse the cached archive), print
#                             "ref digest" and stop; containerd is not
#                             touched (deploy/images/reproducible.sh)
#   KILN_APT_SOURCES          apt sources file for mmdebstrap; default: the
#                             host's Debian sources if they carry the recipe's
#                             suite, else deb.debian.org
#
# Reproducible: nothing of the build host or the build time goes into the
# image (see "reproducible" below), so the same recipe and the same package
# versions give the same image digest on any host.
#
# A recipe folder holds (see python/ for a worked example):
#   recipe.sh      suite, files, entrypoint, env, customize, smoke, stubs,
#                  list_packages (sourced by this script)
#   packages       the Debian packages to install, one per line
#   runtime.json   the runtime profile the worker reads from the image's
#                  kiln.runtime.profile label (sandbox/runtimes/profile.go)
set -euo pipefail

# Bump when this script changes what it builds from the same recipe.
readonly format=kiln-image-recipe-v2

die() {
  echo "build.sh: $*" >&2
  exit 1
}

[ $# -eq 1 ] || die "usage: build.sh NAME (a folder under deploy/images)"
name=$1
case $name in
  '' | *[!a-z0-9._-]*) die "image name '$name' must be lower-case letters, digits, '.', '_' or '-'" ;;
esac

here=$(cd "$(dirname "$0")" && pwd)
images_dir=${KILN_IMAGES_DIR:-$here}
recipe=$images_dir/$name
cache=${KILN_IMAGE_CACHE:-/var/cache/kiln/images}
addr=${KILN_CONTAINERD_ADDRESS:-/run/containerd/containerd.sock}
ns=${KILN_CONTAINERD_NAMESPACE:-kiln}
snapshotter=${KILN_SNAPSHOTTER:-overlayfs}
repo=kiln.local/$name
ref=$repo:latest
label=kiln.recipe.sha256

[ -d "$recipe" ] || die "no recipe folder $recipe"
[ -f "$recipe/recipe.sh" ] || die "$recipe/recipe.sh missing"
[ -f "$recipe/packages" ] || die "$recipe/packages missing"
[ -f "$recipe/runtime.json" ] || die "$recipe/runtime.json missing (the runtime profile)"
for bin in mmdebstrap umoci ctr tar sha256sum flock jq dpkg-deb; do
  command -v "$bin" >/dev/null || die "$bin not found; run deploy/local/deps.sh (make deps) first"
done
[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap root mode, containerd import)"

suite='' workdir='' user='' epoch=''
files=() entrypoint=() env=() smoke=() stubs=() list_packages=()
# shellcheck source=python/recipe.sh
. "$recipe/recipe.sh"
[ -n "$suite" ] || die "$recipe/recipe.sh sets no suite"
[ ${#entrypoint[@]} -gt 0 ] || die "$recipe/recipe.sh sets no entrypoint"
profile_json=$(jq -c . "$recipe/runtime.json") || die "$recipe/runtime.json is not valid JSON"
[ "$(jq -r .name <<<"$profile_json")" = "$name" ] || die "$recipe/runtime.json: \"name\" must be \"$name\", the folder's name"

for f in "${files[@]}"; do
  read -r src _ _ <<<"$f"
  [ -f "$recipe/$src" ] || die "$name: $src missing (expected at $recipe/$src); the image cannot be built without it"
done

ctr_() { ctr --address "$addr" --namespace "$ns" "$@"; }
no_import=${KILN_IMAGE_NO_IMPORT:-}
[ -n "$no_import" ] || ctr_ version >/dev/null 2>&1 || die "containerd not answering on $addr; run deploy/local/containerd.sh (make containerd) first"

# recipe_hash prints the SHA-256 over the recipe folder: every regular file
# (symbolic links followed, so recipes can share a launcher) but Python's
# bytecode caches (__pycache__, left by running a launcher's tests),
# in byte order of its path, as path NUL content-hash.
recipe_hash() {
  (
    cd "$recipe"
    printf '%s\n' "$format"
    find -L . -name __pycache__ -prune -o -type f -print0 | LC_ALL=C sort -z | while IFS= read -r -d '' f; do
      printf '%s\0' "${f#./}"
      sha256sum <"$f" | cut -d' ' -f1
    done
  ) | sha256sum | cut -d' ' -f1
}

hash=$(recipe_hash)
short=${hash:0:12}
dir=$cache/$name-$hash
tar_=$dir/image.tar
rootfs=$dir/rootfs

mkdir -p "$cache"
exec 9>"$cache/$name.lock"
flock 9

# image_line prints the `ctr images ls` row of image $1 (ref, type, digest,
# size, platforms, labels); nothing when containerd does not have it.
image_line() { ctr_ images ls "name==$1" 2>/dev/null | awk -v r="$1" '$1 == r'; }

# unpacked says whether the image's top snapshot (its chain id, recorded at
# build time) exists in the snapshotter.
unpacked() {
  [ -s "$dir/chainid" ] && ctr_ snapshots --snapshotter "$snapshotter" info "$(cat "$dir/chainid")" >/dev/null 2>&1
}

write_json() {
  local digest
  digest=$(image_line "$ref" | awk '{print $3}')
  [ -n "$digest" ] || die "containerd lost $ref right after import"
  printf '{"name":"%s","digest":"%s","recipe_sha256":"%s","rootfs":"%s"}\n' \
    "$ref" "$digest" "$hash" "$rootfs" >"$cache/$name.json.tmp"
  mv "$cache/$name.json.tmp" "$cache/$name.json"
  echo "$ref $digest"
}

# archive_digest prints the manifest digest an archive's index names: the
# image digest containerd reports once it is imported.
archive_digest() { tar -xOf "$1" ./index.json | grep -o 'sha256:[0-9a-f]\{64\}' | head -n1; }

if [ -n "$no_import" ] && [ -s "$tar_" ]; then
  echo "$ref $(archive_digest "$tar_")"
  exit 0
fi

if [ -s "$tar_" ] && [ -d "$rootfs" ] && image_line "$ref" | grep -q "$label=$hash" && unpacked; then
  write_json
  exit 0
fi

import() {
  echo "build.sh: importing $tar_ into containerd namespace $ns as $ref"
  ctr_ images import --base-name "$repo" --snapshotter "$snapshotter" "$tar_" >/dev/null
  ctr_ images tag --force "$ref" "$repo:$short" >/dev/null
  ctr_ images label "$ref" "$label=$hash" >/dev/null
  ctr_ images label "$repo:$short" "$label=$hash" >/dev/null
  unpacked || die "$ref imported but not unpacked for snapshotter $snapshotter (chain id $(cat "$dir/chainid"))"
}

if [ -s "$tar_" ] && [ -d "$rootfs" ] && [ -s "$dir/chainid" ]; then
  import
  write_json
  exit 0
fi

# --- full build ---------------------------------------------------------------
start=$(date +%s)
work=$cache/.$name-$hash.tmp
# remove_work unmounts whatever a build that was killed mid-way left mounted
# under the work dir (mmdebstrap mounts /proc, /sys and /dev into the rootfs
# while it runs), deepest first, then removes the tree without crossing into
# a mount it could not undo.
remove_work() {
  [ -e "$work" ] || return 0
  local m
  awk -v w="$work/" 'index($2, w) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" || true
  done
  rm -rf --one-file-system "$work"
}
remove_work
mkdir -p "$work" "$cache/debs"
trap remove_work EXIT

sources=${KILN_APT_SOURCES:-}
if [ -z "$sources" ]; then
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    if [ -s "$f" ] && grep -Eq "^[^#]*[[:space:]]$suite([[:space:]]|$)" "$f"; then
      sources=$f
      break
    fi
  done
fi
mirror_args=()
if [ -n "$sources" ]; then
  mirror_args=("$sources")
  echo "build.sh: apt sources from $sources"
else
  echo "build.sh: host apt sources do not carry $suite; using deb.debian.org"
fi

include=$(sed -e 's/#.*//' "$recipe/packages" | tr -s ' \t\n' ',' | sed -e 's/^,//' -e 's/,$//')
[ -n "$include" ] || die "$recipe/packages lists no packages"

# reproducible: every timestamp the build leaves (mmdebstrap's, dpkg's logs,
# file mtimes in the layer, the image config) is this fixed instant, not the
# build's clock. A recipe may set its own epoch.
export SOURCE_DATE_EPOCH=${epoch:-1700000000}
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# stubs: empty packages standing in for hard dependencies that only matter
# when building (python3-scipy depends on python3-pythran, which drags in
# g++, the boost headers and python3-dev). Each is installed in place of the
# real package; the image's dpkg database says what it is.
stub_args=()
for stub in "${stubs[@]}"; do
  [[ $stub =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || die "stub '$stub' is not a Debian package name"
  mkdir -p "$work/stubs/$stub/DEBIAN"
  cat >"$work/stubs/$stub/DEBIAN/control" <<CONTROL
Package: $stub
Version: 0~kiln1
Architecture: all
Maintainer: Kiln <kiln@localhost>
Description: stand-in for $stub, not needed at run time
 Installed by deploy/images/build.sh so that a package depending on it can be
 installed without its build-time dependency chain.
CONTROL
  dpkg-deb --root-owner-group -Zxz --build "$work/stubs/$stub" "$work/stubs/$stub.deb" >/dev/null
  stub_args+=("--include=$work/stubs/$stub.deb")
done
# dpkg runs inside the chroot: this hook makes the stub files visible there
# under the same path, and removes them afterwards.
[ ${#stub_args[@]} -eq 0 ] || stub_args+=(--hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount)

echo "build.sh: building $name ($short) from $suite: $include"
mmdebstrap_log=$work/mmdebstrap.log
# essential variant: only Essential:yes packages plus ours; apt runs from
# outside, so neither apt nor its lists end up in the image.
# merged-usr hook: sets /usr up directly and installs usr-is-merged instead of
# usrmerge (which would pull in perl).
if ! mmdebstrap --variant=essential --mode=root --format=directory \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --include="$include" "${stub_args[@]}" \
  --aptopt='APT::Install-Recommends "false"' \
  --aptopt='Acquire::Languages "none"' \
  --dpkgopt='force-unsafe-io' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-include=/usr/share/locale/locale.alias' \
  --dpkgopt='path-exclude=/usr/share/lintian/*' \
  --skip=essential/unlink \
  --setup-hook="mkdir -p \"\$1/var/cache/apt/archives\"" \
  --setup-hook="sync-in $cache/debs /var/cache/apt/archives" \
  --customize-hook="sync-out /var/cache/apt/archives $cache/debs" \
  "$suite" "$work/rootfs" "${mirror_args[@]}" 2>"$mmdebstrap_log" </dev/null; then
  tail -n 30 "$mmdebstrap_log" >&2
  die "mmdebstrap failed (full log above in part; rerun to reproduce)"
fi
echo "build.sh: packages installed in $(($(date +%s) - start)) s"

root=$work/rootfs
for f in "${files[@]}"; do
  read -r src dst mode <<<"$f"
  install -D -m "$mode" -o 0 -g 0 "$recipe/$src" "$root$dst"
done
if declare -F customize >/dev/null; then
  customize "$root"
fi
# Nothing in the image needs these at run time.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
  "$root"/var/log/* "$root"/var/lib/dpkg/*-old
# reproducible: nothing of the build host (mmdebstrap copies its name and
# resolver in for the install; the sandbox sets its own hostname and has no
# network), no per-build identity, no caches that record build-time state.
rm -f "$root"/etc/hostname "$root"/etc/resolv.conf "$root"/etc/machine-id \
  "$root"/var/lib/dbus/machine-id "$root"/var/cache/ldconfig/aux-cache
rm -rf "$root"/tmp/* "$root"/var/tmp/*
chmod 1777 "$root/tmp"

# The sandbox runs as 65534; it must resolve to a name inside the image.
chroot "$root" getent passwd 65534 >/dev/null || die "uid 65534 does not resolve inside the image"
if [ ${#smoke[@]} -gt 0 ]; then
  echo "build.sh: smoke test: ${smoke[*]}"
  chroot --userspec=65534:65534 "$root" env -i HOME=/nonexistent PATH=/usr/bin:/bin \
    MPLCONFIGDIR=/tmp/.mpl "${smoke[@]}" || die "smoke test failed inside the image"
  rm -rf "$root/tmp/.mpl"
fi
# What the runtime can import, as JSON ({"language","version","packages":
# [{"name","version","modules"}]}); GET /v1/runtimes shows it.
packages_json='{}'
if [ ${#list_packages[@]} -gt 0 ]; then
  packages_json=$(chroot --userspec=65534:65534 "$root" env -i HOME=/nonexistent PATH=/usr/bin:/bin \
    "${list_packages[@]}" | jq -c .) || die "listing the image's packages failed: ${list_packages[*]}"
  rm -rf "$root"/tmp/* 
fi

# One layer holding the whole tree. /dev, /proc and /sys stay as empty mount
# points: the runtime provides them.
echo "build.sh: packing OCI image"
tar --create --file="$work/layer.tar" --numeric-owner --sort=name \
  --mtime="@$SOURCE_DATE_EPOCH" --format=gnu \
  --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
  --directory="$root" .
layout=$work/oci
umoci init --layout "$layout"
umoci new --image "$layout:latest"
umoci raw add-layer --image "$layout:latest" --history.created "$created" --history.created_by "deploy/images/build.sh $name" "$work/layer.tar"
rm -f "$work/layer.tar"
config_args=(--image "$layout:latest" --os linux --architecture "$(dpkg --print-architecture)"
  --config.workingdir "$workdir" --config.user "$user"
  --config.label "$label=$hash" --config.label "org.opencontainers.image.title=$repo"
  --config.label "kiln.runtime.profile=$profile_json"
  --config.label "kiln.runtime.packages=$packages_json"
  --created "$created" --history.created "$created"
  --history.created_by "deploy/images/build.sh $name (config)")
for a in "${entrypoint[@]}"; do config_args+=(--config.entrypoint "$a"); done
for e in "${env[@]}"; do config_args+=(--config.env "$e"); done
umoci config "${config_args[@]}"
umoci gc --layout "$layout"
tar --create --file="$work/image.tar" --numeric-owner --sort=name --mtime="@$SOURCE_DATE_EPOCH" --directory="$layout" .

# The chain id of the single layer is its diff id; recorded so later runs can
# ask the snapshotter whether the image is unpacked.
manifest=$(grep -o '"digest":"sha256:[0-9a-f]\{64\}"' "$layout/index.json" | head -n1 | grep -o 'sha256:[0-9a-f]*')
config_digest=$(grep -o '"config":{[^}]*' "$layout/blobs/sha256/${manifest#sha256:}" | grep -o 'sha256:[0-9a-f]\{64\}')
diff_ids=$(sed -n 's/.*"diff_ids":\[\([^]]*\)\].*/\1/p' "$layout/blobs/sha256/${config_digest#sha256:}" | grep -o 'sha256:[0-9a-f]\{64\}')
chain=
for d in $diff_ids; do
  if [ -z "$chain" ]; then chain=$d; else chain=sha256:$(printf '%s %s' "$chain" "$d" | sha256sum | cut -d' ' -f1); fi
done
[ -n "$chain" ] || die "could not read the layer diff ids from the image config"
echo "$chain" >"$work/chainid"
rm -rf "$layout"

# Publish the cache entry atomically, then drop older builds of this image
# but the newest two (each holds a full root filesystem; the previous one is
# kept for switching back and forth between two recipe versions).
rm -rf "$dir"
mkdir -p "$dir"
mv "$work/image.tar" "$work/chainid" "$dir/"
mv "$root" "$rootfs"
mv "$mmdebstrap_log" "$dir/"
kept=0
while IFS= read -r old; do
  [[ ${old##*/} =~ ^$name-[0-9a-f]{64}$ ]] || continue
  kept=$((kept + 1))
  if [ "$kept" -gt 2 ] && [ "$old" != "$dir" ]; then
    rm -rf "$old"
  fi
done < <(ls -1dt "$cache/$name"-*)

if [ -n "$no_import" ]; then
  echo "build.sh: built $name in $(($(date +%s) - start)) s (not imported); image.tar $(du -h "$tar_" | cut -f1), rootfs $(du -sh "$rootfs" | cut -f1)"
  echo "$ref $(archive_digest "$tar_")"
  exit 0
fi
import

# containerd keeps every imported version; drop the tags (and so, after its
# garbage collection, the content and snapshots) of builds no longer cached.
kept_tags=" "
for d in "$cache/$name"-*; do
  [[ ${d##*/} =~ ^$name-([0-9a-f]{12})[0-9a-f]{52}$ ]] && kept_tags+="${BASH_REMATCH[1]} "
done
ctr_ images ls -q | while IFS= read -r r; do
  t=${r#"$repo":}
  if [ "$t" != "$r" ] && [[ $t =~ ^[0-9a-f]{12}$ ]] && [[ $kept_tags != *" $t "* ]]; then
    echo "build.sh: removing old image $r"
    ctr_ images rm "$r" >/dev/null || true
  fi
done

echo "build.sh: built $name in $(($(date +%s) - start)) s; image.tar $(du -h "$tar_" | cut -f1), rootfs $(du -sh "$rootfs" | cut -f1)"
write_json
