"""The platform's custom metrics: the catalogue (:mod:`.catalog`) and the EMF writer (:mod:`.emf`)."""

from gpufleet.metrics.emf import Metrics, RecordingMetrics

__all__ = ["Metrics", "RecordingMetrics"]
