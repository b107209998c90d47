"""``gpufleet admin`` commands through the administration API (here the real handler behind the SigV4-verifying
gateway, over moto): admin principals only, every change audited. ``safety-profile`` get/set/clear (migrate talks to
the control table directly: an upgrade tool) and ``node deregister``."""

from __future__ import annotations

import json

import boto3
import pytest
from fast_moto import fast_mock_aws

from gpufleet.cli.main import main
from gpufleet.store.safety_profiles import get_profile
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames

T = TableNames(control="ops-control")
OPERATOR = "arn:aws:iam::123456789012:role/ops"
ALICE = "arn:aws:iam::123456789012:user/alice"
KEYS = {OPERATOR: ("AKIAOPERATOR0000", "operator-secret-000000000000"), ALICE: ("AKIAALICE0000000", "alice-secret-000")}


@pytest.fixture
def ddb(offline_cli):
    offline_cli("GPUFLEET_CONTROL_TABLE", T.control)
    offline_cli("USER", "ops-alice")
    with fast_mock_aws():
        client = boto3.client("dynamodb", region_name="us-east-1")
        create_tables(client, T)
        yield client


@pytest.fixture
def admin_api(ddb, monkeypatch):
    """The administration API behind the gateway; yields a function signing the CLI as a principal."""
    from gpufleet.adminapi.settings import AdminApiSettings, build_admin_api
    from gpufleet.clock import SystemClock
    from gpufleet.devstack.gateway import Gateway, LocalCredential
    from gpufleet.store.principals import put_principal

    put_principal(ddb, T.control, OPERATOR, "ops", "platform", "op", admin=True)
    put_principal(ddb, T.control, ALICE, "t1", "vision", "alice")
    from lambdas.nodes import register

    api = build_admin_api(AdminApiSettings(control_table=T.control), dynamodb=ddb, clock=SystemClock())
    register._settings.cache_clear()  # the registration function's settings: this test's tables

    def route(event, context=None):  # as the deployed API: POST /v1/nodes is the registration function
        return (register.handler if event.get("path") == "/v1/nodes" else api.handle)(event, context)

    creds = [LocalCredential(access_key_id=k, secret_access_key=sec, principal_arn=arn) for arn, (k, sec) in KEYS.items()]
    with Gateway(lambda: route, creds, region="us-east-1") as gw:
        def as_principal(arn: str) -> str:
            key, secret = KEYS[arn]
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
            return gw.url
        yield as_principal


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["admin", "safety-profile", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _audit(ddb) -> list[dict]:
    import datetime

    from gpufleet.store.admin import DynamoAdminStore

    return DynamoAdminStore(ddb, T.control).audit_log(datetime.datetime.now(datetime.UTC).strftime("%Y-%m"), 50)


def test_set_get_and_clear_go_through_the_administration_api_and_are_audited(ddb, admin_api, capsys):
    url = admin_api(OPERATOR)
    assert main(["admin", "tenant", "create", "kids", "--endpoint", url]) == 0
    capsys.readouterr()
    code, out, _ = _cli(capsys, "get", "--tenant", "kids", "--endpoint", url)
    assert code == 0 and "deployment default" in out

    code, out, _ = _cli(capsys, "set", "--tenant", "kids", "--threshold", "exposed_skin=0.03", "--max-frames", "16",
                        "--json", "--endpoint", url)
    assert code == 0
    written = json.loads(out)
    assert (written["version"], written["frame_thresholds"], written["max_frames"]) == (1, {"exposed_skin": 0.03}, 16)
    assert written["updated_by"] == OPERATOR  # the signed caller, not a name the command line claims
    assert get_profile(ddb, T.control, "kids").frame_thresholds == {"exposed_skin": 0.03}

    code, out, _ = _cli(capsys, "get", "--tenant", "kids", "--endpoint", url)
    assert code == 0 and "exposed_skin=0.03" in out and "version: 1" in out

    code, _, err = _cli(capsys, "set", "--tenant", "kids", "--threshold", "exposed_skin=0.05",
                        "--expected-version", "5", "--endpoint", url)
    assert code == 1 and "version 1" in err
    assert get_profile(ddb, T.control, "kids").version == 1

    code, out, _ = _cli(capsys, "clear", "--tenant", "kids", "--endpoint", url)
    assert code == 0 and "cleared" in out
    cleared = get_profile(ddb, T.control, "kids")
    assert cleared.version == 2 and cleared.is_default()

    changes = [(r["action"], r["actor"]) for r in _audit(ddb) if r["action"] == "safety.set"]
    assert changes == [("safety.set", OPERATOR)] * 2  # both writes, each with its actor


def test_a_non_admin_principal_is_refused_and_nothing_is_written(ddb, admin_api, capsys):
    url = admin_api(OPERATOR)
    assert main(["admin", "tenant", "create", "kids", "--endpoint", url]) == 0
    url = admin_api(ALICE)
    code, _, err = _cli(capsys, "set", "--tenant", "kids", "--threshold", "exposed_skin=0.5", "--endpoint", url)
    assert code != 0 and err
    assert get_profile(ddb, T.control, "kids") is None


@pytest.mark.parametrize("argv,message", [
    (("--threshold", "exposed_skin=0"), "frame_thresholds"),
    (("--threshold", "exposed_skin=1.5"), "frame_thresholds"),
    (("--threshold", "skin=0.1"), "unknown moderation categories"),
    (("--threshold", "exposed_skin"), "CATEGORY=VALUE"),
    ((), "at least one"),
])
def test_invalid_settings_are_refused_and_nothing_is_written(ddb, admin_api, capsys, argv, message):
    url = admin_api(OPERATOR)
    assert main(["admin", "tenant", "create", "kids2", "--endpoint", url]) == 0
    capsys.readouterr()
    code, _, err = _cli(capsys, "set", "--tenant", "kids2", *argv, "--endpoint", url)
    assert code == 1 and message in err
    assert get_profile(ddb, T.control, "kids2") is None


def test_help_says_which_commands_use_the_administration_api(capsys):
    with pytest.raises(SystemExit):
        main(["admin", "safety-profile", "set", "--help"])
    assert "administration API" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["admin", "safety-profile", "migrate", "--help"])
    assert "DynamoDB control table" in capsys.readouterr().out


def test_migrate_moves_profiles_from_the_tenant_partition(ddb, capsys):
    from gpufleet.store.dynamo import marshal

    old = {"sk": "SAFETY", "type": "safety_profile", "frame_thresholds": {"exposed_skin": 0.05}, "version": 3,
           "updated_at": "2026-01-01T00:00:00Z"}
    ddb.put_item(TableName=T.control, Item=marshal({"pk": "TENANT#kids", "tenant": "kids", **old}))
    ddb.put_item(TableName=T.control, Item=marshal({"pk": "TENANT#kids", "sk": "TENANT", "webhook_secret": "whsec_x"}))
    assert get_profile(ddb, T.control, "kids") is None  # the old key is not read
    code, out, _ = _cli(capsys, "migrate", "--json")
    assert code == 0 and json.loads(out) == {"moved": ["kids"]}
    moved = get_profile(ddb, T.control, "kids")
    assert moved is not None and moved.version == 3 and moved.frame_thresholds == {"exposed_skin": 0.05}
    keys = {(i["pk"]["S"], i["sk"]["S"]) for i in ddb.scan(TableName=T.control)["Items"]}
    assert keys == {("SAFETY#kids", "SAFETY"), ("TENANT#kids", "TENANT")}  # the tenant item is untouched
    code, out, _ = _cli(capsys, "migrate")
    assert code == 0 and "moved 0" in out


def test_directory_backfill_lists_items_written_before_the_index(ddb, capsys):
    # a node item and a quota node written without gsi2pk (before the directory index existed), a tenant item
    from gpufleet.clock import FakeClock
    from gpufleet.pools import load_pools
    from gpufleet.store.dynamo import marshal
    from gpufleet.store.snapshot import load_snapshot

    names = TableNames(control=T.control)
    ddb.put_item(TableName=T.control, Item=marshal({
        "pk": "NODE#n1", "sk": "NODE", "node_id": "n1", "pool": "onprem-a", "gpu_type": "A100",
        "gpus": [{"index": 0, "milli_free": 1000}], "expires_at": 2_000_000_000}))
    ddb.put_item(TableName=T.control, Item=marshal({"pk": "QUOTA#t1", "sk": "QUOTA", "guarantee": {"*": 1000},
                                                    "borrow_limit": {"*": 1000}}))
    ddb.put_item(TableName=T.control, Item=marshal({"pk": "TENANT#t1", "sk": "TENANT", "webhook_secret": "s"}))
    now = FakeClock(1_800_000_000.0).now()
    assert not load_snapshot(ddb, names, load_pools({}), now).nodes
    code = main(["admin", "directory-backfill", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out) == {"listed": 2}
    snap = load_snapshot(ddb, names, load_pools({}), now)
    assert [n.node_id for n in snap.nodes] == ["n1"] and "t1" in snap.quotas
    tenant = ddb.get_item(TableName=T.control, Key=marshal({"pk": "TENANT#t1", "sk": "TENANT"}))["Item"]
    assert "gsi2pk" not in tenant
    assert main(["admin", "directory-backfill", "--json"]) == 0 and json.loads(capsys.readouterr()[0]) == {"listed": 0}


def test_node_deregister_refuses_a_busy_node_without_force_and_then_removes_it(ddb, admin_api, capsys):
    from gpufleet.nodeapi.liveness import Registration
    from gpufleet.store.nodes import DynamoNodeStore

    nodes = DynamoNodeStore(ddb, T.control)
    nodes.register(Registration(node_id="rack7-n3", pool="onprem-a"))
    ddb.put_item(TableName=T.control, Item={"pk": {"S": "ALLOC#rack7-n3"}, "sk": {"S": "job-q#4"}})
    url = admin_api(ALICE)
    assert main(["admin", "node", "deregister", "rack7-n3", "--force", "--endpoint", url]) != 0
    assert nodes.registration("rack7-n3") is not None
    url = admin_api(OPERATOR)
    capsys.readouterr()
    code = main(["admin", "node", "deregister", "rack7-n3", "--endpoint", url])
    _out, err = capsys.readouterr()
    assert code == 1 and "job-q#4" in err and "force" in err and nodes.registration("rack7-n3") is not None
    code = main(["admin", "node", "deregister", "rack7-n3", "--force", "--json", "--endpoint", url])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out)["attempts"] == ["job-q#4"] and nodes.registration("rack7-n3") is None
    assert main(["admin", "node", "deregister", "rack7-n3", "--force", "--endpoint", url]) == 1  # gone: 404
    assert [r["action"] for r in _audit(ddb)].count("node.deregister") == 1


def test_node_register_writes_the_agent_config_the_agent_loads(ddb, admin_api, capsys, tmp_path):
    from gpufleet.store.nodes import DynamoNodeStore
    from onprem_agent.settings import load_settings

    url = admin_api(OPERATOR)
    path = tmp_path / "agent.toml"
    code = main(["admin", "node", "register", "rack9-n1", "--pool", "onprem-a", "--site", "eu", "--label", "rack=9",
                 "--agent-config", str(path), "--json", "--endpoint", url])
    out, _ = capsys.readouterr()
    assert code == 0 and json.loads(out)["agent_config"] == str(path)
    settings = load_settings(path, {})  # what the agent's entry point does with it
    assert (settings.node_id, settings.pool, settings.node_api_url) == ("rack9-n1", "onprem-a", url)
    assert settings.queue_url.endswith("/gpufleet-node-rack9-n1") and settings.signals_queue_url.endswith("_signals")
    assert (settings.control_table, settings.region) == (T.control, "us-east-1")
    assert settings.labels == {"rack": "9", "site": "eu"}
    assert path.stat().st_mode & 0o777 == 0o640
    # an existing file is never replaced, and the refusal comes before anything is registered
    before = path.read_text()
    assert main(["admin", "node", "register", "rack9-n2", "--pool", "onprem-a", "--agent-config", str(path),
                 "--endpoint", url]) == 1
    assert path.read_text() == before and DynamoNodeStore(ddb, T.control).registration("rack9-n2") is None

