"""The ``gpufleet`` command-line interface."""
