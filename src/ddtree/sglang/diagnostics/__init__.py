"""Checks and measurements around a decode step: the graph-input check, the sync check, the step profiler and the
test bed's step dump and deliberate faults."""
