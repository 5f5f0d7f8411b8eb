#!/usr/bin/env bash
# A draft trained on the GPU machine and brought back alone (speed_sweep.sh PACK=draft) put over the pair whose target
# it was trained on, here, and the pair parted again for the next session to carry:
#   training/put_draft.sh PAIR_PARTS_DIR... DRAFT_PARTS_DIR OUT_DIR
# PAIR_PARTS_DIRs: the folders holding the carried pair's pair.tgz.part* between them (.gpu-pairs/speed-d1 and
# speed-d2); DRAFT_PARTS_DIR: draft.tgz.part* (pair/bN/draft and pair/train.json); OUT_DIR (new or empty): the new
# pair.tgz.part* (15 MiB parts) and pair-sums.txt. A block-16 draft gets the block-8 pair's target copied beside it and
# the block-8 folder dropped (the sweep runs one draft; the target stays one copy). Nothing is written to OUT_DIR when
# a part is missing or the draft does not fit the pair.
set -u
cd "$(dirname "$0")/.."
. testbed/carry.sh
if [ $# -lt 3 ]; then
  echo "usage: $0 PAIR_PARTS_DIR... DRAFT_PARTS_DIR OUT_DIR" >&2; exit 2
fi
args=("$@")
out=${args[-1]}; drafts=${args[-2]}; pair_dirs=("${args[@]:0:$#-2}")
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "put_draft.sh: OUT_DIR $out is not empty: give a new folder (its parts would mix with the new pair's)" >&2
  exit 2
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/put-draft.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/parts" "$tmp/pair"
for d in "${pair_dirs[@]}"; do cp "$d"/pair.tgz.part* "$tmp/parts/" 2>/dev/null; done
carry_unpack pair "$tmp/parts" "$tmp/pair" || exit 1
carry_unpack draft "$drafts" "$tmp/new" || exit 1
mapfile -t blocks < <(cd "$tmp/new/pair" && ls -d b*/draft 2>/dev/null)
if [ ${#blocks[@]} -ne 1 ] || [ ! -f "$tmp/new/pair/train.json" ]; then
  report=no; [ -f "$tmp/new/pair/train.json" ] && report=a
  echo "put_draft.sh: $drafts/draft.tgz.part* hold ${blocks[*]:-no draft} and $report train.json: expected one" \
    "pair/bN/draft and pair/train.json (speed_sweep.sh PACK=draft)" >&2
  exit 1
fi
block=${blocks[0]%/draft}
target=$(cd "$tmp/pair/pair" && ls -d b*/target 2>/dev/null | head -1)
if [ -z "$target" ]; then
  echo "put_draft.sh: the carried pair in ${pair_dirs[*]} has no bN/target" >&2; exit 1
fi
kept=${target%/target}
# a draft of another block size: its own folder with the target, the old one dropped
if [ "$block" != "$kept" ]; then
  mkdir -p "$tmp/pair/pair/$block"
  cp -r "$tmp/pair/pair/$target" "$tmp/pair/pair/$block/"
  rm -rf "${tmp:?}/pair/pair/$kept"
fi
rm -rf "${tmp:?}/pair/pair/$block/draft"
cp -r "$tmp/new/pair/$block/draft" "$tmp/pair/pair/$block/"
cp "$tmp/new/pair/train.json" "$tmp/pair/pair/train.json"
mkdir -p "$out"
OUT=$out carry_pack pair "$tmp/pair" 0 pair || exit 1
(cd "$out" && sha256sum pair.tgz.part* > pair-sums.txt)
echo "[put_draft] $block/draft put over $kept's target: $out"
