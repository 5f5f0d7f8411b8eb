"""testinfra: the host lock cannot be held, planted or abused by another user, and never signals a PID."""

from __future__ import annotations

import re
import time

from .conftest import deploy, guest
from .test_sandbox_host import service_state

LOCK_DIR = "/run/k26-deploy"


def alive(pid: str) -> bool:
    return guest(f"kill -0 {pid}", check=False).returncode == 0


def lock_is_free() -> bool:
    return guest(f"flock --nonblock {LOCK_DIR}/lock true", check=False).returncode == 0


def test_the_lock_folder_is_root_only(host, converged):
    folder = host.file(LOCK_DIR)
    assert folder.user == "root" and folder.group == "root" and folder.mode == 0o700
    denied = guest(f"runuser -u nobody -- bash -c 'exec 9>>{LOCK_DIR}/lock' 2>&1", check=False)
    assert denied.returncode != 0 and "Permission denied" in denied.stdout


def test_a_planted_holder_and_a_users_lock_block_nothing_and_get_nothing_killed(host, converged, tmp_path):
    # a process of root's that a planted holder file names, and a lock held by an unprivileged user at
    # the old world-writable place: the deploy must neither wait for them nor signal either
    guest("rm -f /run/lock/k26-deploy.lock /run/lock/k26-deploy.lock.holder")   # left by releases before 0.3.0
    victim = guest("setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!").stdout.strip()
    squatter = guest("runuser -u nobody -- bash -c 'exec 9>>/run/lock/k26-deploy.lock; flock -n 9 || exit 75; "
                     "setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!'").stdout.strip()
    guest(f"echo '{victim} attacker@x pid 1 since now' > /run/lock/k26-deploy.lock.holder")
    try:
        before = service_state(host)
        play = deploy(tmp=tmp_path)
        assert play.rc == 0, play.out[-3000:]
        assert service_state(host) == before                # an unchanged converge, nothing restarted
        assert alive(victim) and alive(squatter)
        assert lock_is_free()
    finally:
        guest(f"kill {victim} {squatter}; rm -f /run/lock/k26-deploy.lock.holder /run/lock/k26-deploy.lock", check=False)


def wait_free(seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline and not lock_is_free():
        time.sleep(0.5)
    return lock_is_free()


def test_a_dead_plays_lock_expires_by_its_ttl_without_a_signal(converged, tmp_path):
    # a TTL of 10 s needs health waits of 5 s at most (the rule: TTL >= 2 x k26_health_timeout)
    play = deploy("-e", "k26_lock_ttl=10", "-e", "k26_health_timeout=5", tmp=tmp_path,
                  playbook="tests/infra/plays/lock_only.yml")
    assert play.rc == 0, play.out[-3000:]
    holder = guest(f"cat {LOCK_DIR}/holder").stdout
    assert re.match(r"[0-9a-f]+ \S+@\S+ controller-pid \d+ since \S+ ttl 10$", holder.strip()), holder
    assert not lock_is_free()                  # held after its play ended ...
    assert wait_free(20)                       # ... until its TTL, with nobody signalling anything


def test_a_dead_run_of_this_controller_is_taken_over_through_its_token(converged, tmp_path):
    first = deploy(tmp=tmp_path / "a", playbook="tests/infra/plays/lock_only.yml")      # dies holding the lock
    assert first.rc == 0 and not lock_is_free()
    second = deploy(tmp=tmp_path / "b", playbook="tests/infra/plays/lock_only.yml")
    assert second.rc == 0 and "Tell the dead run's holder to end" in second.out, second.out[-3000:]
    guest(f"rm -f {LOCK_DIR}/token.*")         # end the second one's holder the same way
    assert wait_free(10)


def test_another_controllers_lock_fails_fast_and_expires_at_its_ttl(converged, tmp_path):
    # a holder of another controller (not ours to take over), started like try_lock does, with a TTL that outlasts
    # the play's input check (every playbook's first play, on a loaded 2-core machine 10+ s: with a 6 s TTL the
    # holder had ended before the acquire and the play took the lock, 2026-12-04)
    ttl = 40
    started = time.time()
    guest(f"exec 9>>{LOCK_DIR}/lock; flock -n 9 || exit 75; : > {LOCK_DIR}/token.feed; "
          f"echo 'feed someone-else@elsewhere controller-pid 1 since now ttl {ttl}' > {LOCK_DIR}/holder; "
          f"setsid bash -c 'end=$((SECONDS + {ttl})); while [ -e {LOCK_DIR}/token.feed ] && [ $SECONDS -lt $end ]; "
          f"do sleep 1 9>&-; done' </dev/null >/dev/null 2>&1 &")
    try:
        play = deploy(tmp=tmp_path, playbook="tests/infra/plays/lock_only.yml")
        assert play.rc != 0 and "another play holds /run/k26-deploy/lock" in play.out, play.out[-3000:]
        assert "someone-else@elsewhere" in play.out        # refused at once, not served after the holder's TTL
        assert time.time() - started < ttl, "the refusal came only after the holder's TTL"
        time.sleep(max(0.0, started + ttl + 2 - time.time()))
        assert lock_is_free()
    finally:      # a failure here must not leave a holder for the next module's tests (each token ends its holder)
        guest(f"rm -f {LOCK_DIR}/token.*", check=False)
    guest(f"rm -f {LOCK_DIR}/token.feed")


def test_a_run_whose_lock_ran_out_stops_before_its_restart(converged, tmp_path):
    """Issue 48: the holder re-checks its lock before a restart or a promotion; a lock whose TTL ran out under a
    waiting run (a second run could hold the host by then) stops it, naming why; a held one lets it go on."""
    held = deploy("-e", "lock_wait=0", tmp=tmp_path / "held", playbook="tests/infra/plays/lock_check.yml")
    assert held.rc == 0, held.out[-3000:]
    assert lock_is_free()
    lost = deploy("-e", "lock_wait=7", "-e", "k26_lock_ttl=4", "-e", "k26_health_timeout=2", tmp=tmp_path / "lost",
                  playbook="tests/infra/plays/lock_check.yml")
    said = re.sub(r"\s+", " ", lost.out)
    assert lost.rc != 0 and "this run no longer holds the lock /run/k26-deploy (its TTL of 4 s" in said, said[-3000:]
    assert "stops before it restarts the test's service" in said
    assert wait_free(10)
