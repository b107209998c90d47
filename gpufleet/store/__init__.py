"""Adapters to AWS data services. The only package (with gpufleet.local) that imports boto3."""
