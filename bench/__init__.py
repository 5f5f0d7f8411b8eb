"""The benchmarks: each prints a table (docs/benchmarks.md holds the results). Run from the project root as modules
(`python3 -m bench.sglang_speed ...`), so that they import the test bed (`testbed`) and each other by name."""
