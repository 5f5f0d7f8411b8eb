# Sourced (no side effects) by testbed/run.sh: what its pytest run collects.
#
#   gpu_test_targets ARG...
#       prints tests/gpu_sglang unless an argument names a test file or node itself (tests/...), then nothing: the
#       named tests alone run (2026-12-07: `run.sh tests/gpu_sglang/test_width_policy.py` collected the whole
#       directory beside the file and spent a session's last device minutes on tests nobody asked for).
gpu_test_targets() {
  local a
  for a in "$@"; do
    case $a in tests/*) return 0 ;; esac
  done
  echo tests/gpu_sglang
}
