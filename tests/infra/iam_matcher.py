"""A deliberately small IAM evaluator for the on-prem agent policy test (moto does not enforce IAM).

Scope (anything else raises ``NotImplementedError``, so a policy that outgrows it fails loudly):
- Allow statements only, ``Action``/``Resource`` with ``*``/``?`` wildcards, no NotAction/NotResource;
- condition operators ``StringEquals``, ``StringLike`` (the request key must be present and one of its
  values match) and their ``ForAllValues:`` forms (every request value matches; true when absent);
- CloudFormation intrinsics ``Fn::GetAtt [id, Arn]`` (ids resolved by prefix through ``arns``),
  ``Fn::Join`` and ``Ref`` of pseudo parameters; ``${aws:PrincipalTag/...}`` policy variables.

:func:`requests_for` turns one captured boto3 call into the (action, resource, condition context) requests
IAM would authorise, for the operations the agent and runtime use. DynamoDB ``dynamodb:Attributes`` is the
set of top-level names in the key/item and in every expression (condition expressions included: stricter
than IAM may be, never looser).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from urllib.parse import parse_qsl, urlparse

OPERATORS = {"StringEquals": lambda v, p: v == p, "StringLike": fnmatchcase}


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    context: dict[str, list[str]] = field(default_factory=dict)


def resolve(node, arns: dict[str, str], variables: dict[str, str], pseudo: dict[str, str]):
    """The statement with intrinsics and policy variables replaced by strings."""
    if isinstance(node, list):
        return [resolve(n, arns, variables, pseudo) for n in node]
    if isinstance(node, str):
        for k, v in variables.items():
            node = node.replace("${" + k + "}", v)
        return node
    if "Fn::GetAtt" in node and node["Fn::GetAtt"][1] == "Arn":
        (arn,) = [a for prefix, a in arns.items() if node["Fn::GetAtt"][0].startswith(prefix)]
        return arn
    if "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return sep.join(resolve(p, arns, variables, pseudo) for p in parts)
    if "Ref" in node:
        return pseudo[node["Ref"]]
    return {k: resolve(v, arns, variables, pseudo) for k, v in node.items()}


def _listed(x) -> list:
    return x if isinstance(x, list) else [x]


def _condition_holds(conditions: dict, context: dict[str, list[str]]) -> bool:
    for op, keys in conditions.items():
        qualifier, _, base = op.rpartition(":")
        if base not in OPERATORS or qualifier not in ("", "ForAllValues"):
            raise NotImplementedError(op)
        for key, wanted in keys.items():
            got, wanted = context.get(key), _listed(wanted)
            hits = [any(OPERATORS[base](v, w) for w in wanted) for v in got or []]
            if not all(hits) if qualifier == "ForAllValues" else not any(hits):
                return False
    return True


def allowed_by(statements: list[dict], req: Request) -> list[str]:
    """Sids of the statements that allow ``req`` (empty: denied)."""
    sids = []
    for s in statements:
        if s.get("Effect") != "Allow" or {"NotAction", "NotResource", "NotPrincipal"} & set(s):
            raise NotImplementedError(f"unsupported statement {s.get('Sid')}")
        if any(fnmatchcase(req.action.lower(), a.lower()) for a in _listed(s["Action"])) and any(
                fnmatchcase(req.resource, r) for r in _listed(s["Resource"])) and _condition_holds(
                s.get("Condition", {}), req.context):
            sids.append(s.get("Sid", "?"))
    return sids


_WORDS = {"SET", "REMOVE", "ADD", "DELETE", "AND", "OR", "NOT", "IN", "BETWEEN", "attribute_exists",
          "attribute_not_exists", "attribute_type", "begins_with", "contains", "size", "if_not_exists", "list_append"}


def _names(params: dict, *exprs: str) -> set[str]:
    out = set()
    for expr in (params.get(e) for e in exprs):
        for tok in re.findall(r"(?<![.\w#:])[#:]?[A-Za-z_]\w*", expr or ""):  # top-level names only
            if tok.startswith("#"):
                out.add(params["ExpressionAttributeNames"][tok])
            elif not tok.startswith(":") and tok not in _WORDS:
                out.add(tok)
    return out


def _ddb(action: str, p: dict, region: str, account: str) -> Request:
    key = p.get("Key") or p.get("Item") or {}
    attrs = set(key) | _names(p, "UpdateExpression", "ConditionExpression", "ProjectionExpression")
    ctx = {"dynamodb:LeadingKeys": [key["pk"]["S"]]} if "pk" in key else {}
    if attrs and action != "GetItem":
        ctx["dynamodb:Attributes"] = sorted(attrs)
    return Request(f"dynamodb:{action}", f"arn:aws:dynamodb:{region}:{account}:table/{p['TableName']}", ctx)


def requests_for(service: str, op: str, p: dict, region: str, account: str) -> list[Request]:
    if service == "dynamodb" and op == "TransactWriteItems":
        kinds = {"ConditionCheck": "ConditionCheckItem", "Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem"}
        return [_ddb(kinds[k], body, region, account) for item in p["TransactItems"] for k, body in item.items()]
    if service == "dynamodb":
        return [_ddb(op, p, region, account)]
    if service == "s3":
        obj = f"arn:aws:s3:::{p['Bucket']}/{p.get('Key', '')}"
        if op == "PutObject":
            tags = {f"s3:RequestObjectTag/{k}": [v] for k, v in parse_qsl(p.get("Tagging", ""))}
            return [Request("s3:PutObject", obj, tags)] + ([Request("s3:PutObjectTagging", obj, tags)] if tags else [])
        if op in ("GetObject", "HeadObject"):
            return [Request("s3:GetObjectVersion" if p.get("VersionId") else "s3:GetObject", obj)]
        if op == "ListObjectsV2":
            return [Request("s3:ListBucket", f"arn:aws:s3:::{p['Bucket']}", {"s3:prefix": [p.get("Prefix", "")]})]
    if service == "sqs":
        _, acct, name = urlparse(p["QueueUrl"]).path.split("/")
        return [Request(f"sqs:{op}", f"arn:aws:sqs:{region}:{acct}:{name}")]
    if service in ("sfn", "stepfunctions"):
        return [Request(f"states:{op}", "*")]
    raise NotImplementedError(f"{service}.{op}")
