#!/usr/bin/env bash
# A GPU job longer than one device call (10 minutes at most): the job runs in a process session of
# its own, which outlives the call while the machine stays warm, and later calls wait for it.
#   tests/gpu_sglang/bg.sh start CMD...     start CMD in the background and return (log: $BG/log)
#   tests/gpu_sglang/bg.sh wait SECONDS     wait up to SECONDS; print the log's tail; once the job
#                                           has ended, copy what it left in $BG/out to $OUT
# CMD sees OUT=$BG/out (run.sh copies its table, results and logs there).
set -u
BG=${BG:-/tmp/ddtree-bg}
case ${1:-} in
  start)
    shift
    rm -rf "$BG"; mkdir -p "$BG/out"
    OUT="$BG/out" setsid nohup bash -c '"$@"; echo $? > "$0/rc"' "$BG" "$@" > "$BG/log" 2>&1 < /dev/null &
    echo "[bg] started $* (pid $!)" ;;
  wait)
    deadline=$(( $(date +%s) + ${2:?seconds} ))
    while [ ! -f "$BG/rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    tail -c 8000 "$BG/log"
    if [ -f "$BG/rc" ]; then
      echo "[bg] ended, rc $(cat "$BG/rc")"
      [ -n "${OUT:-}" ] && cp "$BG"/out/* "$OUT"/ 2>/dev/null
      exit "$(cat "$BG/rc")"
    fi
    echo "[bg] still running after $2 s" ;;
  *) echo "usage: $0 start CMD... | wait SECONDS" >&2; exit 2 ;;
esac
