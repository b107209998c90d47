"""A deliberately small IAM evaluator for the policy tests (moto does not enforce IAM).

Scope (anything else raises ``NotImplementedError``, so a policy that outgrows it fails loudly):
- Allow and Deny statements (an explicit Deny that matches wins over every Allow, as in IAM), ``Action``/``Resource``
  with ``*``/``?`` wildcards, no NotAction/NotResource;
- condition operators ``StringEquals``, ``StringLike`` (the request key must be present and one of its
  values match; ``ForAnyValue:`` the same, stated for a multi-valued key), their ``ForAllValues:`` forms (every
  request value matches; true when absent: so a
  ``Scan``, which has no leading key, passes a ``ForAllValues`` leading-key condition, as in IAM) and
  their ``IfExists`` forms (true when the key is absent);
- CloudFormation intrinsics ``Fn::GetAtt [id, attr]``, ``Ref``, ``Fn::Join``, ``Fn::Select``/``Fn::Split``
  (with :class:`Template`, ids are resolved from the resource's type and physical name; with a plain
  ``arns`` dict, ``Fn::GetAtt [id, Arn]`` by logical-id prefix) and ``${aws:PrincipalTag/...}`` variables.

:func:`requests_for` turns one captured boto3 call into the (action, resource, condition context) requests
IAM would authorise. DynamoDB ``dynamodb:Attributes`` is the set of top-level names in the key/item and in
every expression (condition expressions included: stricter than IAM may be, never looser); for a read
(GetItem, BatchGetItem, Query) only with a ``ProjectionExpression``, and ``dynamodb:Select`` is
``SPECIFIC_ATTRIBUTES`` then, the request's ``Select`` or ``ALL_ATTRIBUTES`` otherwise;
``dynamodb:ReturnValues`` is a write's ``ReturnValues`` when it names one;
``dynamodb:LeadingKeys`` is the partition key value of the key, item or key condition (of the queried
index for a ``Query`` on a GSI).
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


def resolve(node, arns, variables: dict[str, str], pseudo: dict[str, str]):
    """The statement with intrinsics and policy variables replaced by strings.

    ``arns``: a :class:`Template` (any resource of the template), or a dict of logical-id prefix → ARN.
    """
    if isinstance(node, list):
        return [resolve(n, arns, variables, pseudo) for n in node]
    if isinstance(node, str):
        for k, v in variables.items():
            node = node.replace("${" + k + "}", v)
        return node
    if "Fn::GetAtt" in node:
        lid, attr = node["Fn::GetAtt"]
        if isinstance(arns, Template):
            return arns.attribute(lid, attr)
        if attr == "Arn":
            (arn,) = [a for prefix, a in arns.items() if lid.startswith(prefix)]
            return arn
        raise NotImplementedError(f"GetAtt {lid}.{attr}")
    if "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return sep.join(resolve(p, arns, variables, pseudo) for p in parts)
    if "Fn::Select" in node:
        index, items = node["Fn::Select"]
        return resolve(items, arns, variables, pseudo)[int(index)]
    if "Fn::Split" in node:
        sep, text = node["Fn::Split"]
        return resolve(text, arns, variables, pseudo).split(sep)
    if "Ref" in node:
        if node["Ref"] in pseudo:
            return pseudo[node["Ref"]]
        if isinstance(arns, Template):
            return arns.ref(node["Ref"])
        raise NotImplementedError(f"Ref {node['Ref']}")
    return {k: resolve(v, arns, variables, pseudo) for k, v in node.items()}


class Template:
    """Resolves ``Ref``/``Fn::GetAtt`` of a synthesized template's resources to names and ARNs.

    A resource's physical name is ``physical[logical id]`` (a deployment's), else the name its properties
    give (``TableName``, ``BucketName``, ...), else the logical id.
    """

    NAME_PROPS = ("TableName", "BucketName", "QueueName", "Name", "FunctionName", "StateMachineName",
                  "JobQueueName", "JobDefinitionName", "RoleName")

    def __init__(self, tpl: dict, region: str, account: str, physical: dict[str, str] | None = None) -> None:
        self.resources = tpl["Resources"]
        self.region, self.account = region, account
        self.physical = physical or {}

    def name(self, lid: str) -> str:
        if lid in self.physical:
            value = self.physical[lid]
            return value.rsplit("/", 1)[-1] if value.startswith("https://") else value.rsplit(":", 1)[-1] \
                if value.startswith("arn:") else value
        props = self.resources[lid].get("Properties", {})
        for key in self.NAME_PROPS:
            if isinstance(props.get(key), str):
                return props[key]
        return lid

    def _arn(self, lid: str) -> str:
        kind, name = self.resources[lid]["Type"], self.name(lid)
        r, a = self.region, self.account
        return {
            "AWS::DynamoDB::Table": f"arn:aws:dynamodb:{r}:{a}:table/{name}",
            "AWS::S3::Bucket": f"arn:aws:s3:::{name}",
            "AWS::SQS::Queue": f"arn:aws:sqs:{r}:{a}:{name}",
            "AWS::Events::EventBus": f"arn:aws:events:{r}:{a}:event-bus/{name}",
            "AWS::Lambda::Function": f"arn:aws:lambda:{r}:{a}:function:{name}",
            "AWS::StepFunctions::StateMachine": f"arn:aws:states:{r}:{a}:stateMachine:{name}",
            "AWS::SecretsManager::Secret": f"arn:aws:secretsmanager:{r}:{a}:secret:{name}",
            "AWS::Batch::JobQueue": f"arn:aws:batch:{r}:{a}:job-queue/{name}",
            "AWS::Batch::JobDefinition": f"arn:aws:batch:{r}:{a}:job-definition/{name}:1",
            "AWS::IAM::Role": f"arn:aws:iam::{a}:role/{name}",
            "AWS::KMS::Key": f"arn:aws:kms:{r}:{a}:key/{name}",
            "AWS::Logs::LogGroup": f"arn:aws:logs:{r}:{a}:log-group:{name}:*",
            "AWS::SNS::Topic": f"arn:aws:sns:{r}:{a}:{name}",
            "AWS::RolesAnywhere::TrustAnchor": f"arn:aws:rolesanywhere:{r}:{a}:trust-anchor/{name}",
            "AWS::RolesAnywhere::Profile": f"arn:aws:rolesanywhere:{r}:{a}:profile/{name}",
        }[kind]

    def ref(self, lid: str) -> str:
        if self.physical.get(lid, "").startswith(("arn:", "https://")):
            return self.physical[lid]
        kind = self.resources[lid]["Type"]
        if kind in ("AWS::SQS::Queue",):
            return f"https://sqs.{self.region}.amazonaws.com/{self.account}/{self.name(lid)}"
        if kind in ("AWS::StepFunctions::StateMachine", "AWS::SecretsManager::Secret", "AWS::Batch::JobQueue",
                    "AWS::Batch::JobDefinition", "AWS::SNS::Topic"):
            return self._arn(lid)
        return self.name(lid)

    def attribute(self, lid: str, attr: str) -> str:
        if attr in ("JobQueueArn", "JobDefinitionArn") and self.physical.get(lid, "").startswith("arn:"):
            return self.physical[lid]  # a Batch queue's or definition's Ref is its ARN (a deployment's)
        if attr in ("Arn", "JobQueueArn", "JobDefinitionArn", "TrustAnchorArn", "ProfileArn", "TopicArn"):
            return self._arn(lid)
        if attr == "StreamArn":
            return self._arn(lid) + "/stream/*"
        if attr in ("Name", "QueueName", "TopicName"):
            return self.name(lid)
        raise NotImplementedError(f"GetAtt {lid}.{attr}")

    def role_statements(self, role_lid: str, variables: dict[str, str] | None = None) -> list[dict]:
        """Every statement (Allow and Deny) of the role's inline policies and ``AWS::IAM::Policy`` resources, resolved.

        Managed policies are not included (the functions' is AWSLambdaBasicExecutionRole: logs only).
        """
        pseudo = {"AWS::Partition": "aws", "AWS::Region": self.region, "AWS::AccountId": self.account,
                  "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": "Gpufleet"}
        raw: list[dict] = []
        for p in self.resources[role_lid].get("Properties", {}).get("Policies", []):
            raw += p["PolicyDocument"]["Statement"]
        for r in self.resources.values():
            if r["Type"] == "AWS::IAM::Policy" and {"Ref": role_lid} in r["Properties"].get("Roles", []):
                raw += r["Properties"]["PolicyDocument"]["Statement"]
        return resolve(raw, self, variables or {}, pseudo)


def _listed(x) -> list:
    return x if isinstance(x, list) else [x]


def _condition_holds(conditions: dict, context: dict[str, list[str]]) -> bool:
    for op, keys in conditions.items():
        qualifier, _, base = op.rpartition(":")
        if_exists = base.endswith("IfExists")
        base = base.removesuffix("IfExists")
        if base not in OPERATORS or qualifier not in ("", "ForAllValues", "ForAnyValue"):
            raise NotImplementedError(op)
        for key, wanted in keys.items():
            got, wanted = context.get(key), _listed(wanted)
            if if_exists and got is None:
                continue
            hits = [any(OPERATORS[base](v, w) for w in wanted) for v in got or []]
            if not all(hits) if qualifier == "ForAllValues" else not any(hits):
                return False
    return True


def allowed_by(statements: list[dict], req: Request) -> list[str]:
    """Sids of the statements that allow ``req`` (empty: denied, by no Allow or by an explicit Deny)."""
    sids, denied = [], False
    for s in statements:
        if s.get("Effect") not in ("Allow", "Deny") or {"NotAction", "NotResource", "NotPrincipal"} & set(s):
            raise NotImplementedError(f"unsupported statement {s.get('Sid')}")
        if any(fnmatchcase(req.action.lower(), a.lower()) for a in _listed(s["Action"])) and any(
                fnmatchcase(req.resource, r) for r in _listed(s["Resource"])) and _condition_holds(
                s.get("Condition", {}), req.context):
            if s["Effect"] == "Deny":
                denied = True
            else:
                sids.append(s.get("Sid", "?"))
    return [] if denied else sids


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


_READS = ("GetItem", "BatchGetItem")


def _ddb(action: str, p: dict, region: str, account: str) -> Request:
    key = p.get("Key") or p.get("Item") or {}
    attrs = set(key) | _names(p, "UpdateExpression", "ConditionExpression", "ProjectionExpression")
    ctx = {"dynamodb:LeadingKeys": [key["pk"]["S"]]} if "pk" in key else {}
    if action in _READS:
        ctx["dynamodb:Select"] = ["SPECIFIC_ATTRIBUTES" if p.get("ProjectionExpression") else "ALL_ATTRIBUTES"]
        if p.get("ProjectionExpression"):
            ctx["dynamodb:Attributes"] = sorted(attrs)
    elif attrs:
        ctx["dynamodb:Attributes"] = sorted(attrs)
    if p.get("ReturnValues"):
        ctx["dynamodb:ReturnValues"] = [p["ReturnValues"]]
    return Request(f"dynamodb:{action}", f"arn:aws:dynamodb:{region}:{account}:table/{p['TableName']}", ctx)


def _hash_key(table: str, index: str | None) -> str:
    from gpufleet.store.schema import TABLES

    (t,) = [t for t in TABLES.values() if table.endswith(f"-{t.logical}")]
    return next(i.hash_key for i in t.indexes if i.name == index) if index else t.hash_key


def _query(p: dict, region: str, account: str) -> Request:
    """A Query: the leading key is the value the key condition gives the (index's) partition key."""
    hash_key = _hash_key(p["TableName"], p.get("IndexName"))
    names = {v: k for k, v in (p.get("ExpressionAttributeNames") or {}).items()}
    ref = names.get(hash_key, hash_key)
    m = re.search(rf"(?<![\w#]){re.escape(ref)}\s*=\s*(:\w+)", p["KeyConditionExpression"])
    if not m:
        raise NotImplementedError(f"key condition {p['KeyConditionExpression']}")
    value = p["ExpressionAttributeValues"][m.group(1)]["S"]
    resource = f"arn:aws:dynamodb:{region}:{account}:table/{p['TableName']}"
    if p.get("IndexName"):
        resource += f"/index/{p['IndexName']}"
    ctx = {"dynamodb:LeadingKeys": [value]}
    attrs = _names(p, "ProjectionExpression")
    ctx["dynamodb:Select"] = ["SPECIFIC_ATTRIBUTES" if attrs else p.get("Select", "ALL_ATTRIBUTES")]
    if attrs:
        ctx["dynamodb:Attributes"] = sorted(attrs)
    return Request("dynamodb:Query", resource, ctx)


def requests_for(service: str, op: str, p: dict, region: str, account: str, *, token_resource: str = "*") -> list[Request]:
    """``token_resource``: what IAM evaluates ``states:SendTask*`` against, the ARN of the state machine whose
    execution issued the token (those actions take no resource in the request; ``*`` when unknown)."""
    if service == "dynamodb" and op == "TransactWriteItems":
        kinds = {"ConditionCheck": "ConditionCheckItem", "Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem"}
        return [_ddb(kinds[k], body, region, account) for item in p["TransactItems"] for k, body in item.items()]
    if service == "dynamodb" and op == "BatchGetItem":
        return [_ddb("BatchGetItem", {"TableName": table, "Key": key,
                                      **{k: ask[k] for k in ("ProjectionExpression", "ExpressionAttributeNames") if k in ask}},
                     region, account)
                for table, ask in p["RequestItems"].items() for key in ask["Keys"]]
    if service == "dynamodb" and op == "BatchWriteItem":
        kinds = {"PutRequest": ("PutItem", "Item"), "DeleteRequest": ("DeleteItem", "Key")}
        return [_ddb("BatchWriteItem", {"TableName": table, "Key": body[kinds[k][1]]}, region, account)
                for table, writes in p["RequestItems"].items() for w in writes for k, body in w.items()]
    if service == "dynamodb" and op == "Query":
        return [_query(p, region, account)]
    if service == "dynamodb" and op in ("Scan", "DescribeTable"):
        return [Request(f"dynamodb:{op}", f"arn:aws:dynamodb:{region}:{account}:table/{p['TableName']}")]
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
        if op == "CopyObject":  # reads the source, writes the destination
            src = p["CopySource"]
            if isinstance(src, str):
                path, _, version = src.partition("?versionId=")
                src = {"Bucket": path.split("/", 1)[0], "Key": path.split("/", 1)[1], "VersionId": version or None}
            read = "s3:GetObjectVersion" if src.get("VersionId") else "s3:GetObject"
            return [Request(read, f"arn:aws:s3:::{src['Bucket']}/{src['Key']}"), Request("s3:PutObject", obj)]
        if op == "DeleteObject" and p.get("VersionId"):
            return [Request("s3:DeleteObjectVersion", obj)]
        if op in ("GetObjectTagging", "PutObjectTagging", "DeleteObject"):
            return [Request(f"s3:{op}", obj)]
    if service == "sqs" and op in ("CreateQueue", "GetQueueUrl"):
        return [Request(f"sqs:{op}", f"arn:aws:sqs:{region}:{account}:{p['QueueName']}")]
    if service == "sqs":
        _, acct, name = urlparse(p["QueueUrl"]).path.split("/")
        return [Request(f"sqs:{op}", f"arn:aws:sqs:{region}:{acct}:{name}")]
    if service in ("sfn", "stepfunctions") and op == "StartExecution":
        return [Request("states:StartExecution", p["stateMachineArn"])]
    if service in ("sfn", "stepfunctions") and op in ("StopExecution", "DescribeExecution"):
        return [Request(f"states:{op}", p["executionArn"])]
    if service in ("sfn", "stepfunctions"):
        return [Request(f"states:{op}", token_resource)]
    if service == "eventbridge" and op == "PutEvents":
        return [Request("events:PutEvents", f"arn:aws:events:{region}:{account}:event-bus/{e.get('EventBusName') or 'default'}",
                        {"events:source": [e.get("Source", "")], "events:detail-type": [e.get("DetailType", "")]})
                for e in p["Entries"]]
    if service == "secrets-manager" and op == "GetSecretValue":
        return [Request("secretsmanager:GetSecretValue", p["SecretId"])]
    if service == "batch" and op == "TerminateJob":
        return [Request("batch:TerminateJob", f"arn:aws:batch:{region}:{account}:job/{p['jobId']}")]
    if service == "batch" and op in ("ListJobs", "DescribeJobs"):
        return [Request(f"batch:{op}", "*")]  # no resource-level scoping in IAM
    if service == "batch" and op == "DescribeJobDefinitions":
        return [Request("batch:DescribeJobDefinitions", "*")]  # no resource-level scoping in IAM
    if service == "batch" and op == "RegisterJobDefinition":
        # the definition (every revision's ARN has the name), its tags (TagResource), and the roles it names are
        # passed to Batch (iam:PassRole)
        definition = f"arn:aws:batch:{region}:{account}:job-definition/{p['jobDefinitionName']}"
        out = [Request("batch:RegisterJobDefinition", definition)]
        if p.get("tags"):
            out.append(Request("batch:TagResource", definition))
        roles = {t.get(k) for t in (p.get("ecsProperties") or {}).get("taskProperties", [])
                 for k in ("executionRoleArn", "taskRoleArn")}
        roles |= {(p.get("containerProperties") or {}).get(k) for k in ("executionRoleArn", "jobRoleArn")}
        return out + [Request("iam:PassRole", r) for r in sorted(x for x in roles if x)]
    if service == "batch" and op == "SubmitJob":
        return [Request("batch:SubmitJob", q) for q in (p["jobQueue"], p["jobDefinition"])]
    if service == "kms" and op in ("Encrypt", "Decrypt"):  # webhook signing secrets, sealed per tenant
        ctx = {f"kms:EncryptionContext:{k}": [v] for k, v in (p.get("EncryptionContext") or {}).items()}
        return [Request(f"kms:{op}", p["KeyId"], ctx)]
    if service == "sts" and op == "AssumeRole":  # the node API vends per-attempt credentials
        return [Request("sts:AssumeRole", p["RoleArn"])]
    raise NotImplementedError(f"{service}.{op}")
