"""Looking inside a model: the trace of one forward pass and every view read from it.

- ``trace.py``            :class:`Trace`: the recorded tensors, the logit lens, probabilities,
                          attention patterns (the single source of every view below)
- ``token_pieces.py``     tokens as readable strings (partial characters as ``<0xE6>``)
- ``explain.py``          ``clearlm explain``'s numbers; ``plots.py`` its pictures,
                          ``report.py`` its tables and HTML page
- ``sampling_explain.py`` what each step of the sampling chain kept, then the pick
- ``analysis.py``         what ``clearlm ui``'s page shows
- ``walkthrough.py``      the seeds' worked examples, computed by the real layer code

- ``distance.py``         how far two models' logits are apart on the same tokens
- ``lens_vocab.py``       TransformerLens's vocabulary: the run_with_cache cache, cfg, hook args
- ``diff.py``             where two versions of one model part, hook point by hook point
                          (``clearlm diff``); ``diff_plot.py`` its picture

May import generation, model, sampling, config and errors. Nothing is imported here, so
``clearlm.api.model`` can use ``clearlm.inspect.trace`` without importing the views
(``analysis.py``, ``explain.py``), which read a loaded ``clearlm.api.model.Model``: the one
exception to the layers, listed in tests/project/test_structure.py.
"""
