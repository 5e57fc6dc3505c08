#!/usr/bin/env bash
# Installs the wrapper through which containerd's runc-v2 shim runs gVisor's
# runsc for runtimes whose isolation is gvisor, as $KILN_RUNSC (default
# /usr/local/lib/kiln/runsc-kiln). The worker passes that path as the shim's
# BinaryName, as it does the pinned runc for every other runtime.
#
# runsc comes from Debian (package runsc, installed by deploy/local/deps.sh).
# Debian ships no containerd-shim-runsc-v1, so runsc is driven as if it were
# runc; the wrapper adds the global flags Kiln needs:
#   --network=none   no network stack but loopback inside gVisor's netstack
#                    (runsc refuses its default sandbox network when the
#                    shim starts it in the host's network namespace);
#   --oci-seccomp    Kiln's seccomp profile is also applied inside gVisor,
#                    to the program's calls into gVisor's kernel;
#   --platform=ptrace  the platform that works without /dev/kvm.
set -euo pipefail

dest=${KILN_RUNSC:-/usr/local/lib/kiln/runsc-kiln}
runsc=${KILN_RUNSC_BINARY:-/usr/bin/runsc}

[ -x "$runsc" ] || { echo "runsc.sh: $runsc not found; run deploy/local/deps.sh (Debian package runsc)" >&2; exit 1; }

want=$(printf '#!/bin/sh\n# Written by deploy/local/runsc.sh: runsc as the runc-v2 shim runs it for Kiln.\nexec %s --network=none --oci-seccomp --platform=ptrace "$@"\n' "$runsc")
if [ -x "$dest" ] && [ "$(cat "$dest")" = "$want" ]; then
  exit 0
fi
tmp=$(mktemp)
printf '%s\n' "$want" >"$tmp"
install -D -m 0755 "$tmp" "$dest"
rm -f "$tmp"
echo "runsc.sh: installed $dest ($("$runsc" --version 2>/dev/null | head -n1))"
