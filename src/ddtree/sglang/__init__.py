"""The SGLang plugin for DDTREE (sglang 0.5.23).

Importing this package imports nothing from SGLang: SGLang's plugin loader calls
`ddtree.sglang.plugin:register` (entry point group `sglang.srt.plugins`, name `ddtree`) inside
its own processes, and only that function imports SGLang.
"""
