#!/usr/bin/env bash
# Makes sure a containerd answers on $KILN_CONTAINERD_ADDRESS (default
# /run/containerd/containerd.sock). If none does, starts containerd in the
# background with a Kiln-written config and waits until it answers: the pinned
# containerd 1.7 that deploy/local/containerd-build.sh installs, or Debian's
# containerd (1.6.20, past its end of life) when that is not built.
# Idempotent: a running containerd is left alone.
#
# Environment (all optional):
#   KILN_CONTAINERD_ADDRESS  socket path; default /run/containerd/containerd.sock
#   KILN_CONTAINERD_ROOT     root dir; default /var/lib/containerd for the default
#                            socket, /var/lib/kiln/containerd otherwise
#   KILN_CONTAINERD_STATE    state dir; default /run/containerd for the default
#                            socket, <socket dir>/state otherwise
#   KILN_LOG_DIR             default /var/log/kiln (containerd.log goes there)
#   KILN_STATE_DIR           default /var/lib/kiln (the generated config goes there)
#   KILN_CONTAINERD_BIN_DIR  where containerd-build.sh installed containerd and its
#                            shim; default /usr/local/lib/kiln
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/closefds.sh"

default_addr=/run/containerd/containerd.sock
addr=${KILN_CONTAINERD_ADDRESS:-$default_addr}
if [ "$addr" = "$default_addr" ]; then
  root=${KILN_CONTAINERD_ROOT:-/var/lib/containerd}
  state=${KILN_CONTAINERD_STATE:-/run/containerd}
else
  # A second containerd must not share the root or state dir of the first.
  root=${KILN_CONTAINERD_ROOT:-/var/lib/kiln/containerd}
  state=${KILN_CONTAINERD_STATE:-$(dirname "$addr")/state}
fi
logdir=${KILN_LOG_DIR:-/var/log/kiln}
statedir=${KILN_STATE_DIR:-/var/lib/kiln}
log=$logdir/containerd.log
config=$statedir/containerd.toml

answers() {
  ctr --address "$addr" --connect-timeout 2s --timeout 5s version >/dev/null 2>&1
}

if answers; then
  exit 0
fi

bin_dir=${KILN_CONTAINERD_BIN_DIR:-/usr/local/lib/kiln}
if [ -x "$bin_dir/containerd" ]; then
  containerd_bin=$bin_dir/containerd
else
  containerd_bin=$(command -v containerd || true)
  echo "containerd.sh: $bin_dir/containerd is not built (deploy/local/containerd-build.sh); using ${containerd_bin:-no containerd}" >&2
fi
[ -n "$containerd_bin" ] || { echo "containerd.sh: containerd not found; run make deps first" >&2; exit 1; }
for bin in ctr runc; do
  if ! command -v "$bin" >/dev/null; then
    echo "containerd.sh: $bin not found; run deploy/local/deps.sh (make deps) first" >&2
    exit 1
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "containerd.sh: containerd is not answering on $addr and starting it needs root" >&2
  exit 1
fi

mkdir -p "$logdir" "$statedir" "$(dirname "$addr")" "$root" "$state"

# Two callers at once (parallel make, two terminals) must not start two
# daemons on the same root: the second would hang on the metadata lock.
exec 9>"$statedir/containerd.lock"
flock 9
if answers; then
  exit 0
fi

# runc: Kiln does not use the runc on PATH (Debian's 1.1.5 lacks the fixes for
# CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881). The worker names the
# pinned build from deploy/local/runc.sh in every container's runc-v2 shim
# options (BinaryName); containerd's own config can only set that for CRI
# runtimes, which Kiln does not use.
# The CRI plugin is for Kubernetes and only adds start-up time and log noise
# here; everything else keeps containerd's defaults (overlayfs snapshotter,
# io.containerd.runc.v2 shim).
cat >"$config" <<TOML
# Written by deploy/local/containerd.sh; edits are overwritten.
version = 2
root = "$root"
state = "$state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "$addr"
TOML

echo "containerd.sh: starting $("$containerd_bin" --version) on $addr (root $root, log $log)"
{ echo; echo "=== $(date -u +%FT%TZ) containerd.sh: starting containerd"; } >>"$log"
# setsid + nohup + no inherited descriptors (closefds.sh): the daemon outlives this script
# and never holds the caller's stdout open (which would stall `make | tee`).
# $bin_dir comes first on its PATH, so it runs the runc-v2 shim built with it.
(run_without_inherited_fds env PATH="$bin_dir:$PATH" setsid nohup "$containerd_bin" --config "$config" </dev/null >>"$log" 2>&1) &
pid=$!

for _ in $(seq 1 150); do
  if answers; then
    echo "containerd.sh: containerd (pid $pid) is ready"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "containerd.sh: containerd exited during start-up; last log lines from $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  sleep 0.2
done
echo "containerd.sh: containerd (pid $pid) did not answer on $addr within 30 s; last log lines from $log:" >&2
tail -n 30 "$log" >&2
exit 1
