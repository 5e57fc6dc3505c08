#!/usr/bin/env bash
# Makes sure a redis-server answers on 127.0.0.1:6379 (or KILN_REDIS_PORT),
# starting a daemonized one if nothing does. Used by `make up`; tests start
# their own private redis-server.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/closefds.sh"

port=${KILN_REDIS_PORT:-6379}
logdir=${KILN_LOG_DIR:-/var/log/kiln}
datadir=${KILN_STATE_DIR:-/var/lib/kiln}/redis

answers() {
  [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]
}

for bin in redis-server redis-cli; do
  if ! command -v "$bin" >/dev/null; then
    echo "redis.sh: $bin not found; run deploy/local/deps.sh (make deps) first" >&2
    exit 1
  fi
done

if answers; then
  exit 0
fi

mkdir -p "$logdir" "$datadir"
echo "redis.sh: starting redis-server on 127.0.0.1:$port (data $datadir, log $logdir/redis.log)"
(run_without_inherited_fds redis-server --bind 127.0.0.1 --port "$port" --daemonize yes \
  --dir "$datadir" --logfile "$logdir/redis.log" --pidfile "$datadir/redis.pid" \
  --appendonly yes </dev/null)

for _ in $(seq 1 50); do
  if answers; then
    echo "redis.sh: redis-server is ready"
    exit 0
  fi
  sleep 0.1
done
echo "redis.sh: redis-server did not answer on 127.0.0.1:$port within 5 s; last log lines:" >&2
tail -n 30 "$logdir/redis.log" >&2 || true
exit 1
