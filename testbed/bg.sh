#!/usr/bin/env bash
# A GPU job longer than one device call (10 minutes at most): the job runs in a process session of
# its own, which outlives the call while the machine stays warm, and later calls wait for it.
#   testbed/bg.sh start CMD...     start CMD in the background and return (log: $BG/log)
#   testbed/bg.sh wait SECONDS     wait up to SECONDS; print the log's tail; copy what the job
#                                           has left in $BG/out so far to $OUT, each file once (a file
#                                           changed since is sent again), at most 7 files
#                                           and 48 MiB a call (MAX_FILES, MAX_MIB)
# CMD sees OUT=$BG/out (run.sh copies its table, results and logs there).
set -u
BG=${BG:-/tmp/ddtree-bg}
send_new() {   # the job's files not yet sent (name, size and time as sent before), oldest first, at most MAX_FILES
  # (7) and MAX_MIB (48) a call - the device returns 8 files and 64 MiB a call, running.tgz among them; the rest wait.
  # A folder (run.sh's logs/) goes as one archive NAME.tgz, again whenever a file in it changed (the device brings back
  # plain files only: on 2026-12-07 a job's server logs stayed on a machine that was then given back)
  local f src size key n=0 bytes=0
  touch "$BG/sent"
  mkdir -p "$BG/packed"
  for f in $(ls -tr "$BG"/out/ 2>/dev/null); do
    if [ -d "$BG/out/$f" ]; then
      key="$f/ $(cd "$BG/out" && find "$f" -type f -printf '%P %s %T@\n' | sort | md5sum | cut -c1-32)"
      src="$BG/packed/$f.tgz"
    else
      key="$f $(stat -c %s "$BG/out/$f").$(stat -c %Y "$BG/out/$f")"
      src="$BG/out/$f"
    fi
    grep -qxF "$key" "$BG/sent" && continue
    [ -d "$BG/out/$f" ] && tar czf "$src" -C "$BG/out" "$f" 2>/dev/null
    size=$(stat -c %s "$src")
    if [ "$n" -ge "${MAX_FILES:-7}" ] || [ $(( bytes + size )) -gt $(( ${MAX_MIB:-48} * 1048576 )) ]; then
      echo "[bg] $f and later files wait for the next call"; break
    fi
    cp "$src" "$OUT/" && echo "$key" >> "$BG/sent" && n=$((n + 1)) && bytes=$((bytes + size))
  done
}

case ${1:-} in
  start)
    shift
    rm -rf "$BG"; mkdir -p "$BG/out"
    OUT="$BG/out" setsid nohup bash -c '"$@"; echo $? > "$0/rc"' "$BG" "$@" > "$BG/log" 2>&1 < /dev/null &
    echo "[bg] started $* (pid $!)" ;;
  wait)
    if [ ! -f "$BG/log" ]; then     # a fresh machine: the one that ran the job was given back
      echo "[bg] no job on this machine ($BG/log is missing): the machine that ran it was given back" >&2; exit 3
    fi
    deadline=$(( $(date +%s) + ${2:?seconds} ))
    while [ ! -f "$BG/rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    tail -c 8000 "$BG/log"
    # what the job has finished so far comes back with every wait: a session's device time can end mid-job;
    # so do the tables of parts still running, in one archive running.tgz (run.sh's OUTDIR and decide.sh's
    # folders under /tmp/ddtree-*: results.md / results.json after each test, node-check.md)
    if [ -n "${OUT:-}" ]; then
      send_new
      running=$(ls /tmp/ddtree-*/results.md /tmp/ddtree-*/results.json /tmp/ddtree-*/*/results.json /tmp/ddtree-*/node-check.md 2>/dev/null)
      [ -n "$running" ] && tar czf "$OUT/running.tgz" $running 2>/dev/null
    fi
    if [ -f "$BG/rc" ]; then
      echo "[bg] ended, rc $(cat "$BG/rc")"
      exit "$(cat "$BG/rc")"
    fi
    echo "[bg] still running after $2 s" ;;
  *) echo "usage: $0 start CMD... | wait SECONDS" >&2; exit 2 ;;
esac
