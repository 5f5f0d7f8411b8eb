"""Crash consistency on the sandbox host (issue 29): interrupt a playbook at a task boundary, run it
again, and check what the host is left in.

    python -m tests.infra.crash [PLAYBOOK ...|all] [--mode kill|ssh-drop|both] [--points ...] [--pool]

Each point K of a playbook (deploy.yml, playbooks/sweep.yml, playbooks/validate.yml,
playbooks/rollback.yml, snapshot.yml; scenarios.py says what each point runs): one run is
interrupted at the start of its K-th task (callback_plugins/k26_crash.py counts them over the whole
run) - SIGKILL of its process group (`kill`), or the hosts' SSH sessions killed one second into the
task (`ssh-drop`: Ansible calls the host unreachable mid-task and the run ends without its rescue
and always sections) - then the same command runs again and must pass, and then the host must hold:
- the service is active and /health answers 200;
- the unit runs the release `current` names, and the process started after its unit, env and config
  files were last written (it runs what they say);
- the rollback record equals the running unit (that state passed health and smoke: the record is
  written only after both);
- no host lock is held, no sweep or validation is marked in progress;
- with --pool: the host is back in the sandbox gateway's pool (healthy, ready, takes its key) and
  the fleet lock is free;
- per playbook: deploy runs the budget it asked for; sweep and validate end on the unit that ran
  before them; a rollback runs the snapshot it restored; a snapshot restarted nothing, left its
  repository clean and its newest tag records the running release.
`make crash-test` runs every task boundary of every playbook in both modes (hours);
tests/infra/test_crash.py a fixed sample in `make test`.
"""
