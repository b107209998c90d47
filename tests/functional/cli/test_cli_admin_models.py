"""``gpufleet admin models publish``: an operator uploads a model folder to the models bucket (moto) with their own
credentials; the printed content hash is what the runtime's loader resolves the name to. Bad input is one line on
stderr, exit 1, and nothing is uploaded."""

from __future__ import annotations

import json

import boto3
import pytest
from fast_moto import fast_mock_aws

from gpufleet.cli.main import main
from gpufleet.models.loader import ModelLoader
from gpufleet.store.objectstore import ObjectStore

BUCKET = "ops-models"
ROOT = f"s3://{BUCKET}/models/"


@pytest.fixture
def s3(offline_cli):
    with fast_mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


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
    assert out == f"published wan-small: sha256 {resolved.content_hash} (3 files, {size} bytes) at {ROOT}wan-small/"
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


@pytest.mark.parametrize("argv, message", [
    (["{missing}", "--name", "m", "--root", ROOT], "model folder {missing} does not exist"),
    (["{folder}/transformer", "--name", "m", "--root", ROOT], "is not a model folder: it has no model_index.json"),
    (["{folder}", "--name", "a/b", "--root", ROOT], "cannot name a model"),
    (["{folder}", "--name", ".hidden", "--root", ROOT], "cannot name a model"),
    (["{folder}", "--name", "m", "--root", f"s3://{BUCKET}/models"], "--root must be s3://bucket/prefix/"),
    (["{folder}", "--name", "m", "--root", f"s3://{BUCKET}/"], "--root must be s3://bucket/prefix/"),
    (["{folder}", "--name", "m"], "no models root"),
], ids=["missing-folder", "no-model-index", "slash-name", "dot-name", "root-without-slash", "bucket-root", "no-root"])
def test_bad_input_is_one_line_and_uploads_nothing(s3, folder, tmp_path, capsys, argv, message):
    fill = {"missing": str(tmp_path / "nope"), "folder": str(folder)}
    code = main(["admin", "models", "publish", *(a.format(**fill) for a in argv)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("gpufleet: error: ") and message.format(**fill) in err, err
    assert _keys(s3) == []


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
    assert table[0].startswith("NAME") and table[2].split()[:2] == ["wan-small", resolved.content_hash]

    assert main(["admin", "models", "remove", "wan-small", "--root", ROOT]) == 0
    assert capsys.readouterr().out.startswith("removed wan-small: its manifest and 3 files")
    assert not [k for k in _keys(s3) if k.startswith("models/wan-small/")]
    with pytest.raises(NotFound):
        ModelLoader(tmp_path / "c2", ObjectStore(s3), s3_root=ROOT).resolve("wan-small")
    assert main(["admin", "models", "list", "--root", ROOT, "--json"]) == 0
    assert [m["name"] for m in json.loads(capsys.readouterr().out)] == ["wan-other"]


@pytest.mark.parametrize("argv, message", [
    (["remove", "never-published", "--root", ROOT], "no model 'never-published' is published"),
    (["remove", "a/b", "--root", ROOT], "cannot name a model"),
    (["list", "--root", f"s3://{BUCKET}/"], "--root must be s3://bucket/prefix/"),
    (["list"], "no models root"),
], ids=["remove-unknown", "remove-bad-name", "list-bucket-root", "list-no-root"])
def test_list_and_remove_refuse_bad_input_in_one_line(s3, folder, capsys, argv, message):
    assert main(["admin", "models", "publish", str(folder), "--name", "kept", "--root", ROOT]) == 0
    before = _keys(s3)
    capsys.readouterr()
    code = main(["admin", "models", *argv])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("gpufleet: error: ") and message in err, err
    assert _keys(s3) == before
