#!/usr/bin/env bash
# Builds Kiln's pinned runc from its Go module (with seccomp, through cgo and
# libseccomp) and installs it as $KILN_RUNC (default /usr/local/lib/kiln/runc).
# The worker passes that path to containerd's runc-v2 shim for every sandbox
# (runtime option BinaryName), so Debian's runc (1.1.5, without the fixes for
# CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881) is never used by Kiln.
#
# Cached: nothing is done when the installed binary already reports the pinned
# version. The module download is verified against the pinned go.sum hash
# below (go mod download checks it against the checksum database as well).
#
# Needs: go on PATH (or /usr/local/go/bin), gcc, libseccomp-dev, pkg-config
# (deploy/local/deps.sh installs them).
set -euo pipefail
. "$(dirname "$0")/gomodule.sh"

readonly version=1.5.2
readonly module=github.com/opencontainers/runc
# h1: hash of the module zip, as go.sum records it.
readonly sum='h1:eUUowc2WJCnFYzI87C1WqRcu356Dk/wsoi90y+2wEfE='
dest=${KILN_RUNC:-/usr/local/lib/kiln/runc}

if [ -x "$dest" ] && "$dest" --version 2>/dev/null | head -n1 | grep -qx "runc version $version"; then
  exit 0
fi

export PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || { echo "runc.sh: go not found" >&2; exit 1; }
pkg-config --exists libseccomp || { echo "runc.sh: libseccomp-dev not installed; run deploy/local/deps.sh" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
module_src "$module" "$version" "$sum" "$work/src"
cd src
# The upstream Makefile's tags minus libpathrs (a Rust library Debian 12 does
# not package); -trimpath and an empty build id keep the binary reproducible.
CGO_ENABLED=1 GOFLAGS=-mod=mod go build -trimpath -buildvcs=false \
  -tags 'seccomp urfave_cli_no_docs' \
  -ldflags "-s -w -buildid= -X main.version=$version -X main.gitCommit=v$version" \
  -o "$work/runc" .
"$work/runc" --version | grep -q "libseccomp" || { echo "runc.sh: built runc lacks seccomp support" >&2; exit 1; }
install -D -m 0755 "$work/runc" "$dest"
echo "runc.sh: installed $("$dest" --version | head -n1) at $dest"
