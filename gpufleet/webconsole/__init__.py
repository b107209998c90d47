"""The web console's files: a single page of plain ES modules (no framework, no build step, no third-party
code) that signs its ``/v1`` requests with SigV4 in the browser (docs/console.md). Served locally by
:mod:`gpufleet.devstack.webconsole`; in AWS from a private S3 bucket behind CloudFront."""
