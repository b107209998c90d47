"""The gpufleet CDK app (aws-cdk-lib): stacks and constructs, nothing else."""

import os

# jsii prints a banner on node 20 unless told not to; set before aws_cdk is imported.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")
