"""The embedded local stack (``gpufleet dev``): moto, the deployed template, the SigV4 gateway,
an on-prem agent, the cloud pool's local runner and the scheduler timer, in one state directory."""
