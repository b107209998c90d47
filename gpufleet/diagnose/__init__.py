"""Why are the GPUs not computing? GPU-time attribution over a window (:mod:`.attribution`) and its report (:mod:`.report`)."""
