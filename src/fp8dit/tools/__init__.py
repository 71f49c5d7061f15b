"""Tools around the library: the ``fp8dit`` command (demo, bench, check), shape presets and
the cuDNN FP8 peer the benchmark times. Nothing on the attention path imports them."""
