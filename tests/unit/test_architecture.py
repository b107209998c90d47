"""The architecture checker (archcheck.py) on small synthetic trees, so it cannot pass by missing things;
and the rule that tests mirror the source tree, on the repository itself.

The checks of the repository's own source (cycles, AWS SDK imports, DynamoDB writes) are in
test_architecture_tree.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import archcheck
import pytest

ROOT = Path(__file__).resolve().parents[2]


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


# ------------------------------------------------------------------------------------------ cycles


def test_acyclic_tree_has_no_cycles(tmp_path):
    write_tree(tmp_path, {
        "app/__init__.py": "",
        "app/a.py": "from app import b\nimport os\n",
        "app/b.py": "from . import c\n",
        "app/c.py": "import json\n",
        "tools/x.py": "import app.a\n",
    })
    assert archcheck.import_cycles(tmp_path, ["app", "tools"]) == []


@pytest.mark.parametrize(
    ("a_text", "b_text"),
    [
        pytest.param("import app.b\n", "import app.a\n", id="absolute"),
        pytest.param("from . import b\n", "from .a import thing\n", id="relative"),
        pytest.param("from app import b\n", "from app.a import thing\n", id="from-package-import-submodule"),
        pytest.param(
            "from app import b\n",
            "def f():\n    from app import a\n    return a\n",
            id="inside-a-function",
        ),
        pytest.param(
            "from app import b\n",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.a import Thing\n",
            id="under-type-checking",
        ),
        pytest.param("from .sub import deep\n", "from ..a import x\n", id="two-dot-relative"),
    ],
)
def test_two_module_cycle_is_reported(tmp_path, a_text, b_text):
    files = {"app/__init__.py": "", "app/a.py": a_text, "app/b.py": b_text}
    if "sub" in a_text:
        files = {"app/__init__.py": "", "app/a.py": a_text, "app/sub/__init__.py": "", "app/sub/deep.py": b_text}
    write_tree(tmp_path, files)
    [line] = archcheck.import_cycles(tmp_path, ["app"])
    second = "app.sub.deep" if "sub" in a_text else "app.b"
    assert f"2 modules ['app.a', '{second}']" in line
    assert f"app.a -> {second} -> app.a" in line


def test_cycle_across_packages_reports_all_members_and_a_loop(tmp_path):
    write_tree(tmp_path, {
        "app/__init__.py": "",
        "app/a.py": "import app.b\n",
        "app/b.py": "from agent import c\n",
        "agent/__init__.py": "",
        "agent/c.py": "from app import a\n",
        "agent/d.py": "from agent import c\n",  # imports into the cycle, but is not on it
    })
    [line] = archcheck.import_cycles(tmp_path, ["app", "agent"])
    assert "3 modules ['agent.c', 'app.a', 'app.b']" in line
    assert "agent.c -> app.a -> app.b -> agent.c" in line


def test_namespace_package_without_init(tmp_path):
    write_tree(tmp_path, {
        "app/__init__.py": "",
        "app/ns/a.py": "from app.ns import b\n",
        "app/ns/b.py": "from app.ns.a import X\n",
    })
    [line] = archcheck.import_cycles(tmp_path, ["app"])
    assert "['app.ns.a', 'app.ns.b']" in line


def test_package_init_importing_its_submodule_is_not_a_cycle_by_itself(tmp_path):
    write_tree(tmp_path, {"app/__init__.py": "from app.a import X\n", "app/a.py": "X = 1\n"})
    assert archcheck.import_cycles(tmp_path, ["app"]) == []


def test_strongly_connected_finds_separate_components():
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert archcheck.strongly_connected(graph) == [["a", "b"], ["c", "d", "e"]]
    assert archcheck.shortest_cycle(graph, ["c", "d", "e"]) == ["c", "d", "e", "c"]


def test_deep_chain_does_not_recurse():
    graph = {f"m{i}": {f"m{i + 1}"} for i in range(5000)} | {"m5000": {"m0"}}
    [component] = archcheck.strongly_connected(graph)
    assert len(component) == 5001


# ------------------------------------------------------------------------------------------ forbidden imports

BOTO = ("boto3", "botocore", "mypy_boto3*")


def test_forbidden_imports_are_reported_outside_the_allowlist(tmp_path):
    write_tree(tmp_path, {
        "app/__init__.py": "",
        "app/store/__init__.py": "",
        "app/store/dynamo.py": "import boto3\nfrom botocore.exceptions import ClientError\n",
        "app/core.py": "import os\nimport boto3.session\n",
        "app/lazy.py": "def f():\n    from botocore.exceptions import ClientError\n",
        "app/typed.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mypy_boto3_dynamodb import DynamoDBClient\n"
        ),
        "app/dynamic.py": "import importlib\nm = importlib.import_module('boto3')\n",
        "app/fine.py": "import botocore_like\nfrom app.store import dynamo\n",
    })
    offences = archcheck.forbidden_imports(tmp_path, ["app"], BOTO, ["app/store/*"])
    assert [str(o) for o in offences] == [
        "app/core.py:2: imports boto3",
        "app/dynamic.py:2: imports boto3",
        "app/lazy.py:2: imports botocore",
        "app/typed.py:3: imports mypy_boto3_dynamodb",
    ]


def test_forbidden_imports_allowlist_patterns_match_files_and_folders(tmp_path):
    write_tree(tmp_path, {
        "app/__init__.py": "",
        "app/sdk.py": "import botocore\n",
        "app/sdk_retry.py": "import botocore\n",
        "app/cli/deep/main.py": "import boto3\n",
        "app/sdkx/other.py": "import boto3\n",
    })
    offences = archcheck.forbidden_imports(tmp_path, ["app"], BOTO, ["app/sdk.py", "app/sdk_*.py", "app/cli/*"])
    assert [o.path for o in offences] == ["app/sdkx/other.py"]


# ------------------------------------------------------------------------------------------ forbidden writes

WRITES = ("update_item", "put_item", "transact_write_items", "batch_writer")


def test_forbidden_attribute_uses_are_reported_outside_the_allowlist(tmp_path):
    write_tree(tmp_path, {
        "app/__init__.py": "",
        "app/store/jobs.py": "def save(ddb):\n    ddb.put_item(TableName='t', Item={})\n",
        "app/core.py": """\
            def step(ddb, table):
                ddb.update_item(TableName="t", Key={})
                with table.batch_writer() as batch:
                    batch.put_item(Item={})
                write = ddb.transact_write_items
                return getattr(ddb, "put_item")
        """,
        "app/reads.py": "def read(ddb):\n    return ddb.get_item(TableName='t', Key={})\n",
        "app/fake.py": "class Fake:\n    def put_item(self, **kw):\n        return kw\n",
    })
    offences = archcheck.forbidden_attribute_uses(tmp_path, ["app"], WRITES, ["app/store/*"])
    assert [str(o) for o in offences] == [
        "app/core.py:2: .update_item",
        "app/core.py:3: .batch_writer",
        "app/core.py:4: .put_item",
        "app/core.py:5: .transact_write_items",
        "app/core.py:6: getattr(..., 'put_item')",
    ]


def test_report_lists_every_offender():
    message = archcheck.report("things", [archcheck.Offence("a.py", 3, ".put_item"), "other"])
    assert message == "things (2):\n  a.py:3: .put_item\n  other"


# ------------------------------------------------------------------------------------------ tests mirror the source

# Test folder names that differ from their source package's directory.
TEST_DIR_SOURCES = {"agent": "onprem_agent"}
# "<layer>/<folder>" allowed without a source package, with the reason.
MIRROR_EXCEPTIONS: dict[str, str] = {}


def test_unmirrored_test_dirs_are_reported(tmp_path):
    write_tree(tmp_path, {
        "gpufleet/api/__init__.py": "",
        "gpufleet/scheduler/cycle.py": "",  # a namespace package counts
        "onprem_agent/__init__.py": "",
        "tests/unit/api/test_x.py": "",
        "tests/unit/scheduler/test_y.py": "",
        "tests/unit/agent/test_z.py": "",
        "tests/unit/misc/test_w.py": "",
        "tests/functional/helpers/test_v.py": "",
        "tests/functional/weird/test_u.py": "",
    })
    bad = archcheck.unmirrored_test_dirs(
        tmp_path, ["tests/unit", "tests/functional"], TEST_DIR_SOURCES, {"tests/functional/helpers": "shared"}
    )
    assert bad == [
        "tests/unit/misc (no source package gpufleet/misc/)",
        "tests/functional/weird (no source package gpufleet/weird/)",
    ]


def test_test_folders_mirror_source_packages():
    bad = archcheck.unmirrored_test_dirs(ROOT, ["tests/unit", "tests/functional"], TEST_DIR_SOURCES, MIRROR_EXCEPTIONS)
    assert not bad, archcheck.report(
        "test folders that name no source package (tests for gpufleet/x/y.py live under tests/<layer>/x/)", bad
    )
