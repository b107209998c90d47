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
