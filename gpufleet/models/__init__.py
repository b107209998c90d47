"""Model weights for the video workload: the tiny offline Wan model and weight loading.

- :func:`gpufleet.models.tiny_wan.save_tiny_wan` builds diffusers' tiny Wan test
  model offline (no hub) and saves it as a ``WanPipeline`` folder.
- :class:`gpufleet.models.loader.ModelLoader` resolves a model name to a local
  folder (a local root, an S3 prefix cached by content hash, or the built-in
  ``wan-tiny``) and loads the pipeline.
"""
