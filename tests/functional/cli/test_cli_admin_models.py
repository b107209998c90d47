"""``gpufleet admin models``: an operator uploads a model folder to the models bucket (moto) with their own
credentials and registers it in the model catalog through the administration API (the real handler behind the
SigV4-verifying gateway); the printed content hash is what the runtime's loader resolves the name to and what the
catalog entry holds. Bad input is one line on stderr, exit 1, and nothing is uploaded or registered."""

from __future__ import annotations

import json

import boto3
import pytest
from fast_moto import fast_mock_aws

from gpufleet.cli.main import main
from gpufleet.models.loader import ModelLoader, folder_sha256
from gpufleet.store.objectstore import ObjectStore
from gpufleet.store.schema import create_tables
from gpufleet.tables import TableNames

BUCKET = "ops-models"
ROOT = f"s3://{BUCKET}/models/"


T = TableNames(control="ops-control")
OPERATOR = "arn:aws:iam::123456789012:role/ops"
KEY = ("AKIAOPERATOR0000", "operator-secret-000000000000")


@pytest.fixture
def s3(offline_cli):
    """The models bucket and the administration API (models root ROOT) behind the gateway, the CLI signing as the
    operator (GPUFLEET_ENDPOINT; the same keys reach moto's S3)."""
    from gpufleet.adminapi.settings import AdminApiSettings, build_admin_api
    from gpufleet.clock import SystemClock
    from gpufleet.devstack.gateway import Gateway, LocalCredential
    from gpufleet.store.principals import put_principal

    with fast_mock_aws():
        offline_cli("AWS_ACCESS_KEY_ID", KEY[0])  # after moto's own: the gateway verifies the operator's signature
        offline_cli("AWS_SECRET_ACCESS_KEY", KEY[1])
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        ddb = boto3.client("dynamodb", region_name="us-east-1")
        create_tables(ddb, T)
        put_principal(ddb, T.control, OPERATOR, "ops", "platform", "op", admin=True)
        api = build_admin_api(AdminApiSettings(control_table=T.control, model_s3_root=ROOT), dynamodb=ddb,
                              clock=SystemClock(), s3=client)
        creds = [LocalCredential(access_key_id=KEY[0], secret_access_key=KEY[1], principal_arn=OPERATOR)]
        with Gateway(lambda: api.handle, creds, region="us-east-1") as gw:
            offline_cli("GPUFLEET_ENDPOINT", gw.url)
            client.ddb = ddb
            yield client


def _catalog(s3) -> dict[str, str]:
    """name → content_hash of the catalog entries (the items submission reads)."""
    items = s3.ddb.scan(TableName=T.control)["Items"]
    return {i["pk"]["S"][len("MODEL#"):]: i["content_hash"]["S"] for i in items if i["pk"]["S"].startswith("MODEL#")}


@pytest.fixture
def folder(tmp_path):
    """A model folder as ``WanPipeline.save_pretrained`` lays one out (contents do not matter to publishing)."""
    root = tmp_path / "wan-small"
    (root / "transformer").mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (root / "transformer" / "config.json").write_text("{}")
    (root / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(bytes(range(256)) * 64)
    return root


def _keys(s3) -> list[str]:
    return sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []))


def test_publish_uploads_the_folder_and_prints_the_hash_the_loader_resolves(s3, folder, tmp_path, capsys):
    assert main(["admin", "models", "publish", str(folder), "--name", "wan-small", "--root", ROOT]) == 0
    out = capsys.readouterr().out.strip()
    assert _keys(s3) == ["models/wan-small/manifest.json", "models/wan-small/model_index.json",
                         "models/wan-small/transformer/config.json",
                         "models/wan-small/transformer/diffusion_pytorch_model.safetensors"]
    resolved = ModelLoader(tmp_path / "node-cache", ObjectStore(s3), s3_root=ROOT).resolve("wan-small")
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert out.splitlines() == [
        f"published wan-small: sha256 {resolved.content_hash} (3 files, {size} bytes) at {ROOT}wan-small/",
        "registered wan-small in the model catalog (version 1): jobs may name it"]
    assert _catalog(s3) == {"wan-small": resolved.content_hash}
    assert (resolved.path / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes() == \
        (folder / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes()


def test_the_root_defaults_to_the_environment_and_json_is_machine_readable(s3, folder, monkeypatch, capsys):
    monkeypatch.setenv("GPUFLEET_MODEL_S3_ROOT", ROOT)
    assert main(["admin", "models", "publish", str(folder), "--name", "wan-small", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == "wan-small" and doc["uri"] == f"{ROOT}wan-small/" and doc["files"] == 3
    manifest = s3.get_object(Bucket=BUCKET, Key="models/wan-small/manifest.json")["Body"].read()
    import hashlib

    assert doc["content_hash"] == hashlib.sha256(manifest).hexdigest()
    assert doc["registered"]["content_hash"] == doc["content_hash"] and doc["registered"]["source"] == "published"


@pytest.mark.parametrize("argv, message", [
    (["{missing}", "--name", "m", "--root", ROOT], "model folder {missing} does not exist"),
    (["{folder}/transformer", "--name", "m", "--root", ROOT], "is not a model folder: it has no model_index.json"),
    (["{folder}", "--name", "a/b", "--root", ROOT], "cannot name a model"),
    (["{folder}", "--name", ".hidden", "--root", ROOT], "cannot name a model"),
    (["{folder}", "--name", "m", "--root", f"s3://{BUCKET}/models"], "--root must be s3://bucket/prefix/"),
    (["{folder}", "--name", "m", "--root", f"s3://{BUCKET}/"], "--root must be s3://bucket/prefix/"),
    (["{folder}", "--name", "m"], "no models root"),
    (["{folder}", "--name", "wan-tiny", "--root", ROOT], "wan-tiny is built in"),
], ids=["missing-folder", "no-model-index", "slash-name", "dot-name", "root-without-slash", "bucket-root", "no-root",
        "built-in"])
def test_bad_input_is_one_line_and_uploads_nothing(s3, folder, tmp_path, capsys, argv, message):
    fill = {"missing": str(tmp_path / "nope"), "folder": str(folder)}
    code = main(["admin", "models", "publish", *(a.format(**fill) for a in argv)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("gpufleet: error: ") and message.format(**fill) in err, err
    assert _keys(s3) == [] and _catalog(s3) == {}


def test_without_the_administration_api_nothing_is_uploaded(s3, folder, offline_cli, monkeypatch, capsys):
    monkeypatch.delenv("GPUFLEET_ENDPOINT")
    code = main(["admin", "models", "publish", str(folder), "--name", "m", "--root", ROOT])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "no gpufleet endpoint configured" in err, err
    assert _keys(s3) == []
    # --no-register: the upload alone; the model is not in the catalog until registered
    assert main(["admin", "models", "publish", str(folder), "--name", "m", "--root", ROOT, "--no-register"]) == 0
    assert "not registered" in capsys.readouterr().out and _keys(s3) and _catalog(s3) == {}


def test_a_bucket_that_does_not_exist_is_one_line(s3, folder, capsys):
    code = main(["admin", "models", "publish", str(folder), "--name", "m", "--root", "s3://no-such-bucket/models/"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and err.startswith("gpufleet: error: "), err


def test_list_shows_what_is_published_and_remove_takes_it_back_manifest_first(s3, folder, tmp_path, capsys):
    """An operator sees the published models (name, content hash, files, bytes) and removes one: its manifest and
    files go, a loader resolving the name then finds no model (not half of one), the other model stays."""
    from gpufleet.errors import NotFound

    for name in ("wan-small", "wan-other"):
        assert main(["admin", "models", "publish", str(folder), "--name", name, "--root", ROOT]) == 0
    s3.put_object(Bucket=BUCKET, Key="models/half-uploaded/model_index.json", Body=b"{}")  # no manifest yet
    capsys.readouterr()
    assert main(["admin", "models", "list", "--root", ROOT, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    resolved = ModelLoader(tmp_path / "c1", ObjectStore(s3), s3_root=ROOT).resolve("wan-small")
    assert [(m["name"], m["files"], m["bytes"]) for m in listed] == [("wan-other", 3, size), ("wan-small", 3, size)]
    assert listed[1]["content_hash"] == resolved.content_hash and listed[1]["uri"] == f"{ROOT}wan-small/"
    assert main(["admin", "models", "list", "--root", ROOT]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["NAME", "STATE"]
    assert table[2].split()[:4] == ["wan-small", "registered", resolved.content_hash, resolved.content_hash]

    assert main(["admin", "models", "remove", "wan-small", "--root", ROOT]) == 0
    assert capsys.readouterr().out.startswith("deregistered wan-small (jobs naming it are refused from now on); "
                                              "removed its manifest and 3 files")
    assert _catalog(s3) == {"wan-other": resolved.content_hash}
    assert not [k for k in _keys(s3) if k.startswith("models/wan-small/")]
    with pytest.raises(NotFound):
        ModelLoader(tmp_path / "c2", ObjectStore(s3), s3_root=ROOT).resolve("wan-small")
    assert main(["admin", "models", "list", "--root", ROOT, "--json"]) == 0
    assert [m["name"] for m in json.loads(capsys.readouterr().out)] == ["wan-other"]


@pytest.mark.parametrize("argv, message", [
    (["remove", "never-published", "--root", ROOT], "no model 'never-published' is registered or published"),
    (["remove", "a/b", "--root", ROOT], "cannot name a model"),
    (["list", "--root", f"s3://{BUCKET}/"], "--root must be s3://bucket/prefix/"),
    (["list"], "no models root"),
], ids=["remove-unknown", "remove-bad-name", "list-bucket-root", "list-no-root"])
def test_list_and_remove_refuse_bad_input_in_one_line(s3, folder, capsys, argv, message):
    assert main(["admin", "models", "publish", str(folder), "--name", "kept", "--root", ROOT]) == 0
    before, registered = _keys(s3), _catalog(s3)
    capsys.readouterr()
    code = main(["admin", "models", *argv])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("gpufleet: error: ") and message in err, err
    assert _keys(s3) == before and _catalog(s3) == registered


def test_register_a_local_or_published_model_and_list_shows_each_state(s3, folder, capsys):
    """``register`` records a published model's manifest hash (the server reads it), a local folder's hash computed
    here, or a hash given; ``list`` merges the catalog with the bucket: registered, not registered, differs, local."""
    local = folder_sha256(folder)
    assert main(["admin", "models", "publish", str(folder), "--name", "published-only", "--root", ROOT,
                 "--no-register"]) == 0
    assert main(["admin", "models", "publish", str(folder), "--name", "wan-small", "--root", ROOT]) == 0
    assert main(["admin", "models", "register", "lab-model", "--folder", str(folder), "--json"]) == 0
    capsys.readouterr()
    assert _catalog(s3) == {"wan-small": local, "lab-model": local}
    # the published content changes behind the catalog's back: the entry still names what was registered
    (folder / "transformer" / "config.json").write_text('{"changed": true}')
    changed = folder_sha256(folder)
    assert main(["admin", "models", "publish", str(folder), "--name", "wan-small", "--root", ROOT,
                 "--no-register"]) == 0
    capsys.readouterr()
    assert main(["admin", "models", "list", "--root", ROOT, "--json"]) == 0
    rows = {r["name"]: (r["state"], r["registered_hash"], r["published_hash"]) for r in json.loads(capsys.readouterr().out)}
    assert rows == {"lab-model": ("local", local, None), "published-only": ("not registered", None, local),
                    "wan-small": ("differs", local, changed)}
    assert main(["admin", "models", "list", "--root", ROOT]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines[1:]] == ["lab-model", "published-only", "wan-small"]
    assert "differs" in lines[3] and "not registered" in lines[2]
    # registering again takes the published content (the server reads the manifest); a hash that is not it: 409
    code = main(["admin", "models", "register", "wan-small", "--content-hash", local])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and local in err and changed in err, err
    assert main(["admin", "models", "register", "wan-small", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert (entry["content_hash"], entry["source"], entry["version"]) == (changed, "published", 2)
    assert main(["admin", "models", "register", "published-only"]) == 0
    assert capsys.readouterr().out.startswith(f"registered published-only: sha256 {local} (published, version 1)")


@pytest.mark.parametrize("argv, message", [
    (["register", "nowhere"], "is not published under"),
    (["register", "m", "--content-hash", "ABC"], "--content-hash must be 64 lower-case hex"),
    (["register", "m", "--folder", "{missing}"], "does not exist"),
    (["register", "wan-tiny", "--content-hash", "ab" * 32], "wan-tiny is built in"),
    (["register", ".m", "--content-hash", "ab" * 32], "cannot name a model"),
], ids=["unpublished-without-hash", "bad-hash", "missing-folder", "built-in", "dot-name"])
def test_register_refuses_bad_input_in_one_line(s3, tmp_path, capsys, argv, message):
    code = main(["admin", "models", *(a.format(missing=str(tmp_path / "nope")) for a in argv)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("gpufleet: error: ") and message in err, err
    assert _catalog(s3) == {}


def test_remove_deregisters_a_local_model_that_was_never_published(s3, capsys):
    assert main(["admin", "models", "register", "lab-model", "--content-hash", "ab" * 32]) == 0
    assert main(["admin", "models", "remove", "lab-model", "--root", ROOT]) == 0
    assert "deregistered lab-model" in capsys.readouterr().out and _catalog(s3) == {}
