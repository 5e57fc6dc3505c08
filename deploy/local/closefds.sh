# Sourced by the scripts that start daemons. run_without_inherited_fds runs
# "$@" (exec) with no descriptor open but 0, 1 and 2: a daemon must not hold
# whatever its starter had open (a test run's flock on a lock file, a pipe)
# for the rest of its life.
run_without_inherited_fds() {
  local fd
  for fd in /proc/$BASHPID/fd/*; do
    fd=${fd##*/}
    if [ "$fd" -gt 2 ] 2>/dev/null; then
      eval "exec $fd>&-" 2>/dev/null || true
    fi
  done
  exec "$@"
}
