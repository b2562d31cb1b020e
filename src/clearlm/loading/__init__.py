"""Getting weights in: a model file or folder -> config, tokenizer and a Transformer.

``checkpoint.py`` opens a GGUF file or a Hugging Face folder once (``open_checkpoint``) and reads
each piece when asked; ``gguf_file.py`` / ``gguf.py`` read GGUF tensors and metadata (on the
``gguf`` package), ``gguf_config.py`` and ``gguf_keys.py`` turn metadata into a ModelConfig and
refuse keys that would change the numbers unseen, ``hf.py`` reads safetensors folders,
``generation_config.py`` a folder's sampling defaults, ``peek.py`` answers questions from the
header alone, ``load.py`` checks shapes and assigns weights into a model built on the meta
device, and ``compact/`` keeps block-quantized matrices packed.

May import the families (the per-family mappings), the model, the tokenizer, quant (the
compact Linear), sampling (for FileDefaults), store, config and errors; nothing above it.
"""
