#!/usr/bin/env bash
# Download the pinned SGLang Model Gateway wheel (requirements/gateway.txt) for the GPU test bed's
# CPython 3.12 and split it into three parts of at most 13 MiB, each small enough to ride beside
# one staging bundle of the test bed (a lent GPU machine takes at most 64 MiB per call):
#   tools/fetch_smg_wheel.sh [DIR]     -> DIR/smg1/smg.part00, DIR/smg2/smg.part01, DIR/smg3/smg.part02
#                                          (+ smg.name in each); DIR defaults to .gpu-bundles
# On the GPU machine, copy each part into one folder (SMG_PARTS) as it arrives;
# testbed/run.sh --production joins and installs them.
set -euo pipefail
OUT=$(realpath -m "${1:-.gpu-bundles}"); W=$(mktemp -d)
pin=$(grep -E '^smg==' requirements/gateway.txt)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$W" "$pin"
wheel=$(ls "$W"/smg-*.whl)
split -n 3 -d -a 2 "$wheel" "$W/smg.part"
i=1
for part in "$W"/smg.part*; do
  mkdir -p "$OUT/smg$i"; rm -f "$OUT/smg$i"/smg.part*
  mv "$part" "$OUT/smg$i/smg.part$(printf '%s' "${part##*.part}")"
  basename "$wheel" > "$OUT/smg$i/smg.name"
  i=$((i + 1))
done
rm -rf "$W"
du -sh "$OUT"/smg[123]
