#!/usr/bin/env bash
# Starts Kiln on this machine in all-in-one dev mode (API + worker + embedded
# NATS JetStream in one process) against the local redis-server and containerd,
# runs a sample job, and says how to submit more. Called by `make up`, after
# `make deps containerd redis image build` have run.
set -euo pipefail
cd "$(dirname "$0")/../.."

addr=${KILN_ADDR:-127.0.0.1:8080}
logdir=${KILN_LOG_DIR:-/var/log/kiln}
state=${KILN_STATE_DIR:-/var/lib/kiln}
mkdir -p "$logdir" "$state"
pidfile=$state/dev.pid

if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "kiln dev already running (pid $(cat "$pidfile")); restarting it with the fresh build"
  kill -TERM "$(cat "$pidfile")"
  for _ in $(seq 1 100); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.1; done
fi

KILN_ADDR=$addr setsid nohup ./bin/kiln dev --nats-store "$state/jetstream" >"$logdir/dev.log" 2>&1 &
echo $! >"$pidfile"

for _ in $(seq 1 150); do
  if curl -fsS "http://$addr/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "kiln dev exited during start-up; last log lines:" >&2
    tail -n 30 "$logdir/dev.log" >&2
    exit 1
  fi
  sleep 0.2
done
if ! curl -fsS "http://$addr/readyz" >/dev/null 2>&1; then
  echo "kiln dev did not become ready on $addr within 30 s; last log lines:" >&2
  tail -n 30 "$logdir/dev.log" >&2
  exit 1
fi
# The worker registers its runtime a moment after the API is ready.
for _ in $(seq 1 50); do
  curl -fsS "http://$addr/v1/runtimes" 2>/dev/null | grep -q '"python"' && break
  sleep 0.2
done

echo "Kiln is up: API on http://$addr (pid $(cat "$pidfile"), log $logdir/dev.log)"
echo
echo "Sample job: ./bin/kiln run examples/hello.py"
KILN_SERVER=http://$addr ./bin/kiln run examples/hello.py
echo
cat <<MSG
Submit more:
  ./bin/kiln run FILE.py                    # submit, wait, print output
  ./bin/kiln submit FILE.py && ./bin/kiln get ID --wait
  curl -s http://$addr/v1/jobs?wait=30s -H 'Content-Type: application/json' \\
       -d '{"code":"print(6*7)"}'
API reference: http://$addr/openapi.json    Stop: make down
MSG
