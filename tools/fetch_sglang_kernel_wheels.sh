#!/usr/bin/env bash
# Download the cp312 wheels that let SGLang 0.5.23's JIT tree kernels run on the lent H200
# (torch 2.11 / CUDA 13 there, no network), into the ignored folder .whl/, and FlashInfer's
# headers (all the sampling kernel's JIT build needs of it) into .whl/flashinfer-headers/.
# Versions are the ones sglang==0.5.23 resolves to here (docs/gpu-testbed.md).
#
#   tools/fetch_sglang_kernel_wheels.sh
#   then on the device: pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#                       PYTHONPATH=/tmp/site:.whl/flashinfer-headers pytest -m sglang_kernels tests/gpu
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.whl
PINS=(sglang==0.5.23 apache-tvm-ffi==0.1.11 orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0
      starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 ipython==9.18.1
      traitlets==5.16.1)
mkdir -p "$OUT"
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || true   # /.whl/ is in .gitignore
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_24_x86_64 -d "$OUT" "${PINS[@]}"

# FlashInfer: only its headers travel (the wheel is 65 MB); empty folders satisfy SGLang's lookup.
HDR="$OUT/flashinfer-headers/flashinfer"
if [[ ! -d "$HDR/data/include" ]]; then
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" flashinfer-python==0.7.2
    python3 - "$tmp"/flashinfer_python-*.whl "$HDR" <<'PY'
import sys, zipfile, pathlib
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith("flashinfer/data/include/"):
            z.extract(name, dest.parent)
(dest / "__init__.py").write_text("")
for sub in ("csrc", "cutlass/include", "cutlass/tools/util/include", "spdlog/include"):
    (dest / "data" / sub).mkdir(parents=True, exist_ok=True)
PY
    rm -rf "$tmp"
fi
du -sh "$OUT"
