"""The OpenAPI document: generated from the models, committed copy current, errors documented."""

from __future__ import annotations

from gpufleet.api import openapi

EXPECTED = {
    "/v1/jobs": {"get", "post"},
    "/v1/jobs/{job_id}": {"get", "delete"},
    "/v1/jobs/{job_id}/events": {"get"},
    "/v1/jobs/{job_id}/logs": {"get"},
    "/v1/jobs/{job_id}/output": {"get"},
    "/v1/jobs/{job_id}/webhooks": {"get"},
    "/v1/quota": {"get"},
    "/v1/pools": {"get"},
    "/v1/models": {"get"},
    "/v1/provenance/lookup": {"post"},
    "/v1/openapi.json": {"get"},
    "/v1/jobs/{job_id}/retry": {"post"},
    "/v1/job-arrays": {"post"},
    "/v1/jobs/cancel": {"post"},
    "/v1/costs": {"get"},
    "/v1/admin/quarantine": {"get"},
    "/v1/admin/diagnose": {"get"},
    "/v1/admin/jobs/{job_id}": {"get"},
    "/v1/admin/jobs/{job_id}/release": {"post"},
    "/v1/admin/jobs/{job_id}/cancel": {"post"},
    "/v1/admin/jobs/{job_id}/refinalize": {"post"},
    "/v1/webhooks/secrets": {"get"},
    "/v1/webhooks/secrets/rotate": {"post"},
    "/v1/webhooks/endpoints": {"get", "post"},
    "/v1/webhooks/endpoints/{endpoint_id}": {"get", "patch", "delete"},
}


def test_committed_copy_is_current():
    assert openapi.main(["--check"]) == 0, "docs/openapi.json is stale: python -m gpufleet.api.openapi --write"


def test_document_shape_and_documented_errors():
    doc = openapi.document()
    assert doc["openapi"].startswith("3.1")
    assert {p: set(ops) for p, ops in doc["paths"].items()} == EXPECTED
    assert doc["components"]["securitySchemes"]["sigv4"]["x-amazon-apigateway-authtype"] == "awsSigv4"
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert {"403", "500"} <= codes, (path, method)
            if path != "/v1/openapi.json":  # every route but the document spends the tenant's rate limit
                assert "429" in codes, (path, method)
            for code in codes - {"200", "201", "202", "204"}:
                assert "application/problem+json" in op["responses"][code]["content"], (path, method, code)
    post = doc["paths"]["/v1/jobs"]["post"]
    assert set(post["responses"]) == {"202", "400", "403", "409", "413", "415", "422", "429", "500"}
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in post["parameters"])
    for path in ("/v1/job-arrays", "/v1/jobs/{job_id}/retry"):  # one Idempotency-Key each, 422 on a mismatch
        op = doc["paths"][path]["post"]
        assert "422" in op["responses"] and any(p["name"] == "Idempotency-Key" for p in op["parameters"]), path
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    endpoint = doc["paths"]["/v1/webhooks/endpoints/{endpoint_id}"]
    assert "content" not in endpoint["delete"]["responses"]["204"] and "404" in endpoint["get"]["responses"]
    assert "409" in doc["paths"]["/v1/webhooks/endpoints"]["post"]["responses"]  # limit-reached


def test_docs_api_names_every_spec_limit_and_error_type():
    from pathlib import Path

    from gpufleet import errors
    from gpufleet.spec import LIMITS

    text = (Path(openapi.DOC_PATH).parent / "api.md").read_text()
    missing = [k for k in LIMITS if f"`{k}`" not in text and f"{k}`" not in text]
    assert not missing, f"docs/api.md does not document {missing}"
    # only the hierarchy of gpufleet.errors: other packages' subclasses (e.g. the agent's) are not API answers,
    # and whether they are imported depends on which tests ran first in this process
    slugs = {c.type_slug for c in _subclasses(errors.GpufleetError) if c.__module__ == errors.__name__} - {
        "stale-epoch",
        "cancelled",
        "config",
        "wait-timeout",
        "output-too-large",  # raised by the workflow's CollectOutputs, recorded as the job's failure reason
    }  # not API answers
    assert not [s for s in slugs if f"`{s}`" not in text]


def _subclasses(cls):
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out
