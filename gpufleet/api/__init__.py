"""The public HTTP API (API Gateway REST → Lambda): routes, models, problem mapping, OpenAPI."""
