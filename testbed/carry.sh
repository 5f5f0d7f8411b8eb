# Files carried between the GPU machine and this one: the device tool brings back files of a limited size, so a
# tarball goes back in 15 MiB parts and is put together again on the next machine. Sourced (no side effects) by
# testbed/run.sh, testbed/decide.sh and testbed/speed_sweep.sh.
#
#   carry_pack NAME DIR LIMIT_MIB PATH...
#       tar czf of PATH... (relative to DIR) into $OUT/NAME.tgz.part* (15 MiB parts); a tarball over LIMIT_MIB
#       (0: no limit) is not packed and says so; no PATH present: nothing packed. Prints one line; returns 1 when
#       nothing was packed.
#   carry_unpack NAME FROM DIR
#       FROM/NAME.tgz.part* put together and unpacked into DIR; returns 1 (and says so), unpacking nothing, when FROM
#       holds none, lacks a part in split's sequence (aa, ab, ...) or the parts do not join into a whole gzip stream.

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

carry_parts_in_order() {   # FROM NAME -> FROM/NAME.tgz.part* one per line; returns 1 (and says which) when a part is missing
  local from=$1 name=$2 i=0 part expected letters=abcdefghijklmnopqrstuvwxyz
  for part in "$from/$name.tgz.part"*; do
    expected=$name.tgz.part${letters:i/26:1}${letters:i%26:1}
    if [ "$(basename "$part")" != "$expected" ]; then
      echo "[carry] $from has no $expected (found $(basename "$part") in its place): a part did not arrive; carry it again" >&2
      return 1
    fi
    echo "$part"; i=$((i + 1))
  done
}

carry_unpack() {
  local name=$1 from=$2 dir=$3 listed parts
  if ! ls "$from/$name.tgz.part"* > /dev/null 2>&1; then
    echo "[carry] $from holds no $name.tgz.part*: nothing unpacked" >&2; return 1
  fi
  listed=$(carry_parts_in_order "$from" "$name") || return 1
  mapfile -t parts <<< "$listed"
  if ! cat "${parts[@]}" | gzip -t 2> /dev/null; then    # a last part missing or cut short: the join is not a whole tarball
    echo "[carry] $from/$name.tgz.part* do not make a whole tarball (a part is missing or cut short): nothing unpacked; carry them again" >&2
    return 1
  fi
  mkdir -p "$dir"
  cat "${parts[@]}" | tar xzf - -C "$dir" && echo "[carry] $name unpacked from $from into $dir"
}
