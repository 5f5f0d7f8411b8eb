# Files carried between the GPU machine and this one: the device tool brings back files of a limited size, so a
# tarball goes back in 15 MiB parts and is put together again on the next machine. Sourced (no side effects) by
# tests/gpu_sglang/run.sh, tests/gpu_sglang/decide.sh and bench/speed_sweep.sh.
#
#   carry_pack NAME DIR LIMIT_MIB PATH...
#       tar czf of PATH... (relative to DIR) into $OUT/NAME.tgz.part* (15 MiB parts); a tarball over LIMIT_MIB
#       (0: no limit) is not packed and says so; no PATH present: nothing packed. Prints one line; returns 1 when
#       nothing was packed.
#   carry_unpack NAME FROM DIR
#       FROM/NAME.tgz.part* put together and unpacked into DIR; returns 1 (and says so) when FROM holds none.

CARRY_PART=15M

carry_pack() {
  local name=$1 dir=$2 limit=$3 tmp
  shift 3
  local present=() p
  for p in "$@"; do [ -e "$dir/$p" ] && present+=("$p"); done
  if [ ${#present[@]} -eq 0 ]; then
    echo "[carry] $name: none of $* in $dir: nothing packed"; return 1
  fi
  tmp=$(mktemp "${TMPDIR:-/tmp}/carry-$name.XXXXXX")
  tar czf "$tmp" -C "$dir" "${present[@]}" || { rm -f "$tmp"; echo "[carry] $name: tar failed" >&2; return 1; }
  local size; size=$(stat -c %s "$tmp")
  if [ "$limit" -gt 0 ] && [ "$size" -gt $((limit * 1024 * 1024)) ]; then
    echo "[carry] $name: $((size / 1024 / 1024)) MiB is over its limit of $limit MiB: not packed"
    rm -f "$tmp"; return 1
  fi
  rm -f "$OUT/$name.tgz.part"*
  split -b "$CARRY_PART" "$tmp" "$OUT/$name.tgz.part"
  rm -f "$tmp"
  echo "[carry] $name: ${present[*]} packed, $((size / 1024)) KiB in $(ls "$OUT/$name.tgz.part"* | wc -l) parts"
}

carry_unpack() {
  local name=$1 from=$2 dir=$3
  if ! ls "$from/$name.tgz.part"* > /dev/null 2>&1; then
    echo "[carry] $from holds no $name.tgz.part*: nothing unpacked" >&2; return 1
  fi
  mkdir -p "$dir"
  cat "$from/$name.tgz.part"* | tar xzf - -C "$dir" && echo "[carry] $name unpacked from $from into $dir"
}
