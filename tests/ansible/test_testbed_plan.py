"""The GPU test bed runs the production example's unit changed only as testbed.yml lists.

testbed/production_plan.py renders inventory/production through the real templates
twice, as it is and with the test bed's substitutions, and refuses any difference testbed.yml
does not list; these tests render the same way (Ansible on the controller) and check that rule
catches what it must.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.ansible.test_static import PRODUCTION_FLAGS
from testbed import production_plan as pp


@pytest.fixture(scope="module")
def renders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    bed = pp.testbed()
    out = {}
    for name in ("DDTREE", "NONE"):
        overrides = pp.SERVERS[name]
        example, _ = pp.render({**pp.EXAMPLE_FACTS, **overrides}, tmp)
        test, _ = pp.render({**overrides, **pp.testbed_variables(name, bed)}, tmp)
        out[name] = (example, test)
    return bed, out


@pytest.mark.parametrize("name", ["DDTREE", "NONE"])
def test_the_test_bed_changes_only_what_testbed_yml_lists(renders, name):
    bed, out = renders
    example, test = out[name]
    assert pp.explain_difference(example, test, bed) == []
    assert test.argv[test.argv.index("--port") + 1] == str(pp.port_of(name))
    assert example.argv[0] == "/opt/k26/current/venv/bin/sglang" and test.argv[0] == "/tmp/k26-testbed/venv/bin/sglang"


def test_the_example_unit_reads_as_the_flags_the_template_renders(renders):
    _, out = renders
    example, _ = out["DDTREE"]
    assert example.argv[1:] == ["serve"] + " ".join(PRODUCTION_FLAGS).split()
    assert example.environment["SGLANG_PLUGINS"] == "ddtree"


def with_unit(rendered: pp.Rendered, old: str, new: str) -> pp.Rendered:
    assert old in rendered.unit
    return dataclasses.replace(rendered, unit=rendered.unit.replace(old, new))


@pytest.mark.parametrize("change,message", [
    (lambda t: with_unit(t, "--max-running-requests 48", "--max-running-requests 8"),
     "--max-running-requests '8' differs from the example's '48' and testbed.yml does not list it"),
    (lambda t: with_unit(t, "--disable-overlap-schedule \\\n", ""), "flags differ"),
    (lambda t: with_unit(t, "--max-total-tokens 65536", "--max-total-tokens 999"), "does not end with testbed.yml"),
    (lambda t: with_unit(t, "--tp 1", "--tp 2"), "--tp '2' is not testbed.yml's value '1'"),
    (lambda t: dataclasses.replace(t, env=t.env.replace("SGLANG_PLUGINS=ddtree", "SGLANG_PLUGINS=other")),
     "env SGLANG_PLUGINS='other' differs from the example's 'ddtree'"),
    (lambda t: dataclasses.replace(t, env=t.env + "EXTRA=1\n"), "only in the test bed ['EXTRA']"),
])
def test_an_unlisted_difference_is_reported(renders, change, message):
    bed, out = renders
    example, test = out["DDTREE"]
    problems = pp.explain_difference(example, change(test), bed)
    assert any(message in p for p in problems), problems


def test_a_listed_substitution_that_changes_nothing_is_reported(renders):
    bed, out = renders
    stale = json.loads(json.dumps(bed))
    stale["variables"]["k26_state_dir"]["flags"] = ["--enable-metrics"]
    assert any("lists ['--enable-metrics'] but the render does not change them" in p
               for p in pp.explain_difference(*out["DDTREE"], stale))


def test_a_quoted_word_is_refused_not_guessed():
    unit = "[Service]\nExecStart=/x/sglang serve \\\n    --served-model-name 'two words'\nRestart=on-failure\n"
    with pytest.raises(ValueError, match="quoted words"):
        pp.exec_start(unit)


def test_the_runner_adds_the_test_beds_variables_without_overriding_the_units(renders):
    bed, out = renders
    _, test = out["DDTREE"]
    env = pp.process_env(test.environment, bed, "/site")
    assert env["PYTHONPATH"] == "/site" and env["SGLANG_PLUGINS"] == "ddtree"
    # the unit's own PATH (the venv's bin, where ninja is, before systemd's default) is kept
    assert env["PATH"] == "/tmp/k26-testbed/venv/bin:" + pp.SYSTEMD_PATH
    with pytest.raises(ValueError, match="override the unit's own"):
        pp.process_env({**test.environment, "PYTHONPATH": "/elsewhere"}, bed, "/site")
