"""Trace-driven simulators that run the scheduler's own policy code (``gpufleet simulate``)."""
