#!/usr/bin/env bash
# Builds Kiln's pinned containerd (the 1.7 LTS line) and its runc-v2 shim
# from containerd's Go module and installs them as
# $KILN_CONTAINERD_BIN_DIR/{containerd,containerd-shim-runc-v2} (default
# /usr/local/lib/kiln). deploy/local/containerd.sh starts that containerd,
# with that directory first on its PATH so it runs that shim, instead of
# Debian 12's containerd 1.6.20, which is past its end of life.
#
# Cached: nothing is done when the installed binaries report the pinned
# version. The module download is verified against the pinned go.sum hash
# below (go mod download checks it against the checksum database as well).
#
# Needs: go on PATH (or /usr/local/go/bin) and gcc (deploy/local/deps.sh).
set -euo pipefail
. "$(dirname "$0")/gomodule.sh"

readonly version=1.7.35
readonly module=github.com/containerd/containerd
# h1: hash of the module zip, as go.sum records it.
readonly sum='h1:7AU2T1qI2OdNBmKkreWZ7kASHUNFItN5Hgejd9sY938='
dir_out=${KILN_CONTAINERD_BIN_DIR:-/usr/local/lib/kiln}

installed() {
  [ -x "$dir_out/containerd" ] && [ -x "$dir_out/containerd-shim-runc-v2" ] || return 1
  local d s
  d=$("$dir_out/containerd" --version 2>/dev/null) || return 1
  s=$("$dir_out/containerd-shim-runc-v2" -v 2>/dev/null) || return 1
  [[ "$d" == *" v$version "* && "$s" == *"Version:  v$version"* ]]
}
if installed; then
  exit 0
fi

export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "containerd-build.sh: go not found" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
module_src "$module" "$version" "$sum" "$work/src"
cd src
# Without the btrfs, devmapper, zfs and aufs snapshotters (Kiln uses
# overlayfs; btrfs needs headers Debian keeps in another package).
# -trimpath and an empty build id keep the binaries reproducible.
pkg=github.com/containerd/containerd
CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath -buildvcs=false \
  -tags 'no_btrfs no_devmapper no_zfs no_aufs urfave_cli_no_docs' \
  -ldflags "-s -w -buildid= -X $pkg/version.Version=v$version -X $pkg/version.Revision=v$version -X $pkg/version.Package=$pkg" \
  -o "$work/bin/" ./cmd/containerd ./cmd/containerd-shim-runc-v2
install -D -m 0755 "$work/bin/containerd" "$dir_out/containerd"
install -D -m 0755 "$work/bin/containerd-shim-runc-v2" "$dir_out/containerd-shim-runc-v2"
installed || { echo "containerd-build.sh: the installed binaries do not report v$version" >&2; exit 1; }
echo "containerd-build.sh: installed $("$dir_out/containerd" --version) in $dir_out"
