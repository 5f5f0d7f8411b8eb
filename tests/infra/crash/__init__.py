"""Crash consistency on the sandbox host (issue 29): kill ansible-playbook at a task boundary, run the
same playbook again, and check what the host is left in.

    python -m tests.infra.crash deploy.yml [--points all|N,M,...] [-- EXTRA ANSIBLE ARGS]

Each point K: one run of the playbook is SIGKILLed (its whole process group) at the start of its
K-th task (callback_plugins/k26_crash.py counts them over the whole run), then the same command
runs again and must pass, and then the host must hold these invariants:
- the service is active and /health answers 200;
- the unit runs the release `current` names, and the process started after its unit, env and config
  files were last written (it runs what they say);
- the rollback record equals the running unit (that state passed health and smoke: the record is
  written only after both);
- no lock is held, no sweep or validation is marked in progress.
`make crash-test` runs every task boundary of deploy.yml (hours); tests/infra/test_crash.py a fixed
sample in `make test`.
"""
