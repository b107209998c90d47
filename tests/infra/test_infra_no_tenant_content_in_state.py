"""No tenant content in the workflow's state or in Batch container overrides.

The survey (:mod:`control_plane_survey`) runs every scenario on the deployed stack and keeps each
execution's whole history (every state's input and output, every task's parameters: what execution
logging with data would write) and the command of every Batch job the workflow submitted (its
container overrides). The state carries a pointer envelope (job id, epoch, placement, platform buckets):
no prompt, no container env value, no input URI appears in either; the runtime reads the spec from
the job item (gpufleet/envelope.py, docs/contracts.md). A cloud container job's multi-container Batch job is
submitted by the dispatch function, not the state: its supervisor's command carries the spec less the tenant's
``env`` values, which only the tenant container's environment holds.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.xdist_group("cdk-synth"), pytest.mark.slow]


def test_the_survey_saw_every_kind_of_run(survey):
    # video jobs (generate + finalize), a cloud container job (where rootless podman runs), an on-prem run
    assert len(survey.histories) >= 6 and survey.batch_commands
    stages = {json.loads(c[c.index("--envelope-json") + 1])["stage"]
              for c in survey.batch_commands + survey.supervisor_commands}
    assert {"generate", "finalize"} | (set() if survey.containers_unavailable else {"container"}) <= stages
    assert survey.tenant_content
    if not survey.containers_unavailable:
        assert survey.supervisor_commands and survey.tenant_envs


def test_no_prompt_or_env_in_any_execution_history(survey):
    for job_id, history in survey.histories.items():
        for content in survey.tenant_content:
            assert content not in history, f"{content!r} in the execution history of {job_id}"
        assert '"spec"' not in history.replace('\\"', '"'), f"a spec in the execution history of {job_id}"


def test_batch_overrides_carry_a_pointer_envelope(survey):
    for command in survey.batch_commands:
        text = json.dumps(command)
        for content in survey.tenant_content:
            assert content not in text, f"{content!r} in a Batch job's command"
        envelope = json.loads(command[command.index("--envelope-json") + 1])
        assert "spec" not in envelope and not envelope["s3"].get("inputs"), envelope
        assert envelope["job_id"].startswith("job_") and envelope["epoch"] >= 1


def test_a_cloud_supervisor_gets_the_spec_without_the_tenants_env(survey):
    """The rule for RunCloudContainer's multi-container jobs (never in the state: the dispatch function submits them):
    the supervisor's command is the envelope completed with the spec, as an on-prem node's (the node API never hands
    a spec out), less the tenant's ``env`` values; those reach only the tenant container's environment."""
    if survey.containers_unavailable:
        pytest.skip(f"tenant containers unavailable: {survey.containers_unavailable}")
    for command, tenant_env in zip(survey.supervisor_commands, survey.tenant_envs, strict=True):
        text = json.dumps(command)
        for content in survey.tenant_content:
            assert content not in text, f"{content!r} in a supervisor's command"
        envelope = json.loads(command[command.index("--envelope-json") + 1])
        assert envelope["stage"] == "container" and envelope["spec"]["workload"].get("env", {}) == {}, envelope
        assert "task_token" not in envelope
        assert set(survey.tenant_content) & set(tenant_env.values()), tenant_env  # the tenant's own, where it belongs
        assert not [k for k in tenant_env if k.startswith("AWS_") or k == "GPUFLEET_SUPERVISOR_TOKEN"], tenant_env
