"""One DDTREE decode step's stages (decode_step, in the worker's order), the verdict and the glue to SGLang's
buffers, the draft head, and the per-request features applied at every tree node (penalties, grammars, custom
logit processors, seeded sampling)."""
