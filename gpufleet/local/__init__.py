"""Local emulation: the synthesized CDK template deployed into moto and executed (see ARCHITECTURE.md)."""
