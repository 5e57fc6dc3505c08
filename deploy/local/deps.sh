#!/usr/bin/env bash
# Installs the Debian packages Kiln needs on a build or test machine, but only
# the ones that are missing: a machine that has them all pays one dpkg query.
# Go itself is not installed here; the Makefile expects it on PATH or in
# /usr/local/go/bin.
set -euo pipefail

packages=(
  containerd          # runs the sandboxes (with runc)
  runc
  runsc               # gVisor, for runtimes whose isolation is gvisor (deploy/local/runsc.sh wraps it)
  redis-server        # job records and result cache (redis-cli comes with it)
  redis-sentinel      # Redis HA tests: three Sentinels over a primary and a replica
  mmdebstrap          # builds sandbox image root filesystems from Debian packages
  umoci               # packs a root filesystem as an OCI image
  jq                  # reads runtime.json and package lists into image labels
  debian-archive-keyring
  ca-certificates
  curl                # used by deploy/local/up.sh to wait for the API
  make
  gcc                 # go test -race needs cgo; make init builds the jail library (sandbox/jail)
  libc6-dev
  libseccomp-dev      # deploy/local/runc.sh builds the pinned runc with seccomp
  pkg-config
  python3             # runs the Python SDK's suite (internal/e2e TestSDKs)
  nodejs              # runs the TypeScript SDK's suite (node --test; fetch needs Node >= 18)
  chromium            # headless, drives the run page's suite (internal/e2e TestRunPageInChromium)
  qemu-system-x86     # the cgroup v2 guest of make test-cgroup2 (deploy/local/cgroup2-vm.sh)
  busybox-static      #   its initramfs
  kmod                #   depmod for its kernel's modules
)

# dpkg-query prints one line per package it knows; anything not fully
# installed ("install ok installed") is missing.
missing=()
status=$(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true)
for p in "${packages[@]}"; do
  if ! grep -qx "$p install ok installed" <<<"$status"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "deps: missing Debian packages: ${missing[*]}; run this script as root to install them" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq; then
  echo "deps: apt-get update failed; check /etc/apt/sources.list* and network access to the Debian mirror" >&2
  exit 1
fi
# --no-install-recommends keeps e.g. containerd from pulling in extra tooling;
# policy-rc.d stops the packages' init scripts from starting daemons we start ourselves.
policy=/usr/sbin/policy-rc.d
created_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 755 "$policy"
  created_policy=1
fi
cleanup() { if [ -n "$created_policy" ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
out=$(mktemp)
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$out" 2>&1; then
  tail -n 30 "$out" >&2
  rm -f "$out"
  echo "deps: apt-get install ${missing[*]} failed" >&2
  exit 1
fi
rm -f "$out"
echo "deps: installed ${missing[*]}"
