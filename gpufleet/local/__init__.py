"""Local emulation: the synthesized CDK template deployed into moto and executed (docs/architecture.md, "What the local emulation does not cover", lists its gaps)."""
