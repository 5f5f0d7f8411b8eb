"""Operator tools run on the serving host (python -m ddtree.tools.<name>)."""
