"""Speed and scale beside the readable path (gpt-fast's rule: the model stays plain, speed is
applied from outside).

``threads.py`` picks CPU threads, ``devices.py`` resolves ``--device``, ``precision.py`` sets
matmul precision, ``compiled.py`` (torch.compile) and ``aot.py`` / ``aot_build.py`` (ahead-of-time
compiled decode steps) make the decode step fast, ``aot_batch.py`` does the same for the
serving engine's batched decode pass, and ``parallel/`` splits a model over processes (tensor
and pipeline parallel under torchrun).

A newcomer may skip this whole package: nothing on the readable path (model, sampling,
generation) imports it. It may import everything below it (model, sampling, generation,
loading, quant, families, store, errors, config).
"""
