"""Operator tools run from the project root (python tools/NAME.py); importable as `tools.NAME` by the tests."""
