"""Looking inside a model: the trace of one forward pass and every view read from it.

- ``trace.py``            :class:`Trace`: the recorded tensors, the logit lens, probabilities,
                          attention patterns (the single source of every view below)
- ``token_pieces.py``     tokens as readable strings (partial characters as ``<0xE6>``)
- ``explain.py``          ``clearlm explain``'s numbers; ``plots.py`` its pictures,
                          ``report.py`` its tables and HTML page
- ``sampling_explain.py`` what each step of the sampling chain kept, then the pick
- ``analysis.py``         what ``clearlm ui``'s page shows
- ``walkthrough.py``      the seeds' worked examples, computed by the real layer code

Nothing is imported here, so ``clearlm.api`` can use ``clearlm.inspect.trace`` without
importing the views (which import ``clearlm.api``).
"""
