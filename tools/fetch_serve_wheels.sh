#!/usr/bin/env bash
# Download the cp312 wheels ddtree-serve needs on the lent H200 (its image has torch, httpx,
# prometheus-client, anyio, h11 and click, but not FastAPI/uvicorn/pydantic), into the ignored
# folder .whl-serve/. Versions: the ones requirements/test.txt resolves to here.
#
#   tools/fetch_serve_wheels.sh
#   then on the device (carry .whl-serve):
#     pip install --no-index --no-deps --target /tmp/site .whl-serve/*.whl
#     PYTHONPATH=/tmp/site:src python3 -m pytest tests/gpu/test_serve_gpu.py
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.whl-serve
PINS=(fastapi==0.165.0 uvicorn==0.54.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5
      typing-inspection==0.4.5 annotated-types==0.8.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2)
mkdir -p "$OUT"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT" "${PINS[@]}"
ls "$OUT"
