# Sourced by testbed/enlarged_pair.sh and bench/enlarged_speed.sh (issue 69), after env.sh and with ROOT set:
# `enlarged_prepare TAG` unpacks the carried Marlin JIT cache ($MARLIN_CACHE), installs this project into $SITE and
# trains the decidable Kimi-shaped pair into $ROOT/pair (training/train_pair.py --size kimi-allexp, TRAIN_MINUTES,
# default 2) unless a pair with its prompt files is there. Returns 1 when the training fails.
# `enlarged_copy BIG LAYERS` enlarges that pair with INT4 experts and LAYERS extra MoE layers into BIG unless BIG holds
# one already (ddtree.reference.enlarge, from src/: it may run while the project is being installed into $SITE).
enlarged_prepare() {
  local tag=$1
  if [ -n "${MARLIN_CACHE:-}" ] && ls "$MARLIN_CACHE"/marlin-jit.tgz.part* >/dev/null 2>&1; then
    cat "$MARLIN_CACHE"/marlin-jit.tgz.part* | tar xz -C "$HOME" && echo "[$tag] Marlin JIT cache unpacked"
  fi
  python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target "$SITE" . 2>&1 \
    | grep -vi warning || true
  if [ ! -f "$ROOT/pair/b8/draft/model.safetensors" ] || [ ! -f "$ROOT/pair/train_prompts.json" ]; then
    python3 -m training.train_pair --out "$ROOT/pair" --size kimi-allexp --minutes "${TRAIN_MINUTES:-2}" \
      --block-sizes 8 --prompts 32 --train-prompts 32 --device cuda | grep -E "held-out|steps in" || return 1
  fi
}

enlarged_copy() {
  local big=$1 layers=$2
  [ -f "$big/target/config.json" ] || PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} python3 -m ddtree.reference.enlarge \
    --pair "$ROOT/pair/b8" --out "$big" --int4-experts --extra-layers "$layers"
}
