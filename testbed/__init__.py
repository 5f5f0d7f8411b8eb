"""The GPU test bed: what runs the real `sglang serve` on the lent GPU machine and judges what it answers (issue 73).

servers (a fleet of SGLang servers by name: their flags, ports, start, readiness, stop), referee (whether a parting
from plain decoding is a near tie of the target's own numerics), partings and speed_partings (the partings of whole
answers), node_check (the tree's node logits against the chain control's), production_plan (the production example's
unit rendered for the test bed); the staging and job scripts (run.sh, bg.sh, carry.sh, decide.sh, kimi.sh,
speed_sweep.sh, enlarged_*.sh, widths_overlap.sh) run from the project root. The tests themselves are in
tests/gpu_sglang. Importing a module here starts nothing.
"""
