#!/usr/bin/env bash
# Stops the kiln dev process started by up.sh (redis-server and containerd stay up).
set -euo pipefail
pidfile=${KILN_STATE_DIR:-/var/lib/kiln}/dev.pid
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  kill -TERM "$(cat "$pidfile")"
  for _ in $(seq 1 300); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.1; done
  echo "kiln dev stopped"
else
  echo "kiln dev is not running"
fi
rm -f "$pidfile"
