"""Principals of the administration API functional tests."""

REGION = "us-east-1"
OPERATOR = "arn:aws:iam::123456789012:role/ops"
ALICE = "arn:aws:iam::123456789012:user/alice"
