"""CheckPrompt may read a tenant's safety profile (control table) and freeze it onto the job (jobs table)."""

from __future__ import annotations

import json


def _function(tpl: dict, key: str) -> dict:
    (fn,) = [r for r in tpl["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
             and r["Properties"].get("Environment", {}).get("Variables", {}).get("GPUFLEET_FUNCTION") == key]
    return fn


def _allowed(tpl: dict, role_logical_id: str, table_logical_prefix: str) -> set[str]:
    """Actions the role's policies allow on the table whose logical id starts with the prefix (the table itself)."""
    out: set[str] = set()
    for r in tpl["Resources"].values():
        if r["Type"] != "AWS::IAM::Policy" or {"Ref": role_logical_id} not in r["Properties"].get("Roles", []):
            continue
        for s in r["Properties"]["PolicyDocument"]["Statement"]:
            if s.get("Effect") != "Allow":
                continue
            resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
            if any(isinstance(x, dict) and x.get("Fn::GetAtt", [""])[0].startswith(table_logical_prefix)
                   for x in resources):
                out |= set(s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
    return out


def test_check_prompt_reads_the_control_table_and_updates_the_job(tpl):
    fn = _function(tpl, "check_prompt")
    assert "GPUFLEET_CONTROL_TABLE" in fn["Properties"]["Environment"]["Variables"]
    role = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    assert "dynamodb:GetItem" in _allowed(tpl, role, "DataControlTable"), json.dumps(fn["Properties"]["Role"])
    assert {"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:PutItem"} <= _allowed(tpl, role, "DataJobsTable")
