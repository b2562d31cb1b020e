"""The Python API: ``model = clearlm.load(...)``; ``model.generate(prompt, ...)``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from clearlm.api.batch import generate_prompts, is_batch, stream_prompts
from clearlm.api.checks import (
    check_ids,
    check_messages,
    check_sampling_keywords,
    merge_params,
    with_system,
)
from clearlm.api.decode import attach_decode, parse_decode
from clearlm.api.interpret import InterpretMixin
from clearlm.api.options import (
    parse_activations,
    parse_dtype,
    parse_weights,
    use_int8_activations,
)
from clearlm.api.patching import PatchingMixin
from clearlm.api.speculative import make_drafter, refuse_batch, run_generate, run_stream
from clearlm.config import ModelConfig
from clearlm.errors import ChatTemplateError, ClearLMError
from clearlm.generation.drafters import PromptLookup
from clearlm.generation.grammar import grammar_state
from clearlm.generation.loop import Chunk, GenerationResult, check_fits
from clearlm.generation.stops import check_stop
from clearlm.loading.checkpoint import open_checkpoint
from clearlm.model.transformer import Transformer
from clearlm.runtime.devices import resolve_device
from clearlm.runtime.parallel.place import check_sizes, load_placed
from clearlm.runtime.precision import parse_matmul_precision, set_matmul_precision
from clearlm.runtime.threads import set_threads
from clearlm.sampling.chain import SamplingParams, softmax
from clearlm.sampling.defaults import GENERATE_DEFAULTS, chat_defaults
from clearlm.sampling.grammar import GrammarState, compile_response_format
from clearlm.store.catalog import resolve_model
from clearlm.text import decode_utf8
from clearlm.tokenizer import Tokenizer, drop_vocab_arrays

Messages = Sequence[dict[str, str]]


@dataclass
class Model(InterpretMixin, PatchingMixin):
    """A loaded model: the Transformer, its tokenizer, config and the file's metadata (less
    a GGUF's per-token vocabulary arrays, which ``tokenizer`` holds: tokenizer.gguf.VOCAB_ARRAYS).

    Build one with :func:`load`. Every method takes text (or token ids) and runs on the weights'
    device in their dtype. ``generation_defaults`` holds the sampling values of the folder's
    generation_config.json as transformers reads it (see :mod:`clearlm.sampling.defaults`; empty for
    GGUF files and for a file that sets no sampling key). The interpretability methods
    (run_with_trace, add_hook, hooks, logit_lens, to_str_tokens) come from
    :class:`clearlm.api.interpret.InterpretMixin`, activation patching (patch) from
    :class:`clearlm.api.patching.PatchingMixin`.
    """

    transformer: Transformer
    tokenizer: Tokenizer
    config: ModelConfig
    metadata: dict[str, Any]
    tensor_types: dict[str, str]
    path: str
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    weights: str = "float32"  # "compact": a GGUF's block-quantized matrices stay packed
    weight_bytes: int = 0  # bytes the loaded weights hold in memory
    activations: str = "float32"  # "int8": compact layers' decode products take int8 inputs

    def sampling_params(
        self,
        params: SamplingParams | None = None,
        fallback: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> SamplingParams:
        """The settings a call runs with: ``params`` as given, or else the keywords over the
        model's generation_config.json over ``fallback``.

        Raises:
            SamplingParamsError: both params and keywords were given, or a value is invalid.
        """
        return merge_params(params, sampling, self.generation_defaults, fallback)

    def encode(self, prompt: str | bytes | Sequence[int]) -> list[int]:
        """Text → token ids (BOS added when the file asks for it); ids pass through unchanged.
        Bytes are UTF-8 text; invalid bytes and lone surrogates become U+FFFD.

        Raises ClearLMError for an id outside the vocabulary, PromptTypeError for anything
        but text or integers (a list of strings is a batch: not supported yet)."""
        if isinstance(prompt, bytes | bytearray):  # text, not ids
            prompt = decode_utf8(bytes(prompt), "prompt")
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        ids = check_ids(prompt)  # PromptTypeError: not ids (a dict, bools, strings, ...)
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ClearLMError(
                f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})"
            )
        return ids

    def chat_prompt(
        self, messages: str | Messages, parse_special_in_content: bool = False
    ) -> list[int]:
        """Render a conversation with the file's chat template and tokenize it.

        A plain string is one user message. The rendered text already holds any BOS the
        template writes, so no second one is added. Message contents are text: special-token
        text typed in them ('<|im_end|>') stays ordinary text, and control tokens come only
        from the template (:meth:`Tokenizer.encode_chat`); ``parse_special_in_content=True``
        is the opt-in for trusted messages. Raises ChatTemplateError for an empty
        conversation, a missing template or one that fails.
        """
        if isinstance(messages, bytes | bytearray):  # text, as in encode
            messages = decode_utf8(bytes(messages), "message")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        check_messages(messages)
        if not messages:
            raise ChatTemplateError("the conversation is empty; give at least one message")
        return self.tokenizer.encode_chat(
            list(messages), parse_special_in_content=parse_special_in_content
        )

    def _ids_tensor(self, prompt: str | Sequence[int]) -> torch.Tensor:
        ids = self.encode(prompt)
        check_fits(len(ids), self.config.context_length, new_tokens=0)  # empty or too long
        return torch.tensor([ids], dtype=torch.long)  # (1, T)

    @torch.inference_mode()
    def logits(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """Logits at every position of the prompt: (T, V) float, no cache.

        Raises ContextLengthError for an empty prompt or one longer than the context."""
        return self.transformer(self._ids_tensor(prompt))[0]

    @torch.inference_mode()
    def next_token_distribution(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """P(next token | prompt): softmax of the last position's logits, (V,) float32.

        Raises ContextLengthError for an empty prompt or one longer than the context."""
        last = self.transformer(self._ids_tensor(prompt), last_only=True)[0, -1]
        return softmax(last.float())

    def stream(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 128,
        stop: str | Sequence[str] | None = None,
        params: SamplingParams | None = None,
        response_format: dict[str, Any] | None = None,
        draft: Model | None = None,
        prompt_lookup: bool | PromptLookup = False,
        num_draft: int | None = None,
        **sampling: Any,
    ) -> Iterator[Chunk]:
        """Yield :class:`~clearlm.generation.loop.Chunk` s as tokens are generated.

        Same settings as :meth:`generate`; for a list of prompts, every row's chunks as they
        come (``chunk.index``: which prompt). Raises SamplingParamsError, ContextLengthError.
        """
        check_sampling_keywords(sampling, "stream")
        drafter = make_drafter(self, draft, prompt_lookup, num_draft)
        if is_batch(prompt):
            refuse_batch(drafter)
            return stream_prompts(
                self, prompt, max_new_tokens, stop, params, sampling, response_format
            )
        params = self.sampling_params(params, GENERATE_DEFAULTS, **sampling)
        ids, stops, grammar = self.encode(prompt), check_stop(stop), self.grammar(response_format)
        return run_stream(self, ids, params, max_new_tokens, stops, drafter, grammar)

    def grammar(self, response_format: Any) -> GrammarState | None:
        """A fresh grammar state for OpenAI's ``response_format`` (None: free text).

        Raises SamplingParamsError naming the field and the grammar engine's reason."""
        grammar = compile_response_format(response_format)
        return grammar_state(self.tokenizer, self.config.vocab_size, grammar)

    def generate(
        self,
        prompt: str | Sequence[int] | Sequence[str | Sequence[int]],
        max_new_tokens: int = 128,
        stop: str | Sequence[str] | None = None,
        params: SamplingParams | None = None,
        on_text: Callable[[str], None] | None = None,
        response_format: dict[str, Any] | list[dict[str, Any] | None] | None = None,
        draft: Model | None = None,
        prompt_lookup: bool | PromptLookup = False,
        num_draft: int | None = None,
        **sampling: Any,
    ) -> GenerationResult | list[GenerationResult]:
        """Generate a continuation of a text (or token ids) and return it whole.

        Args:
            prompt: text, tokenized as is (no chat template), or a list of token ids. The
                caller writes the whole prompt, so special-token text in it ('<|im_start|>')
                becomes the control token; use :meth:`chat` for untrusted messages. A list of
                prompts runs them together and returns a list (clearlm.api.batch:
                settings per row), each equal to its prompt run alone.
            max_new_tokens: most tokens to generate (an int ≥ 0).
            stop: a string, or strings, that end generation (not included in the text).
            params: a :class:`~clearlm.sampling.chain.SamplingParams`; or else keywords
                (temperature, top_k, top_p, min_p, repetition_penalty, seed) over the model's
                generation_config.json over GENERATE_DEFAULTS (temperature 0.8).
            on_text: called with each new piece of text as it is produced.
            response_format: structured output, OpenAI's shape: ``{"type": "json_object"}``
                or ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}``
                (the text is then JSON that validates against the schema; it ends, with
                finish_reason "stop", when the JSON closes); None or ``{"type": "text"}``:
                free text. For a list of prompts, one for all or a list, one per prompt.
            draft, prompt_lookup, num_draft: speculative decoding (one prompt): a smaller
                loaded Model with the same tokenizer drafts ``num_draft`` tokens (default 5),
                or ``prompt_lookup=True`` copies them from the text so far (default 10); the
                model checks them in one pass. Greedy output is plain greedy's; sampled output
                has plain sampling's distribution (clearlm.generation.speculative). The
                result's ``speculative`` holds the acceptance counts.

        Raises:
            SamplingParamsError: invalid or unknown settings.
            ContextLengthError: the prompt is empty or too long.
        """
        check_sampling_keywords(sampling, "generate")
        drafter = make_drafter(self, draft, prompt_lookup, num_draft)
        if is_batch(prompt):
            refuse_batch(drafter)
            return generate_prompts(
                self, prompt, max_new_tokens, stop, params, on_text, sampling, response_format
            )
        params = self.sampling_params(params, GENERATE_DEFAULTS, **sampling)
        ids, stops, grammar = self.encode(prompt), check_stop(stop), self.grammar(response_format)
        return run_generate(self, ids, params, max_new_tokens, stops, on_text, drafter, grammar)

    def chat(
        self,
        messages: str | Messages,
        max_new_tokens: int = 256,
        stop: str | Sequence[str] | None = None,
        params: SamplingParams | None = None,
        on_text: Callable[[str], None] | None = None,
        parse_special_in_content: bool = False,
        system: str | None = None,
        response_format: dict[str, Any] | None = None,
        draft: Model | None = None,
        prompt_lookup: bool | PromptLookup = False,
        num_draft: int | None = None,
        **sampling: Any,
    ) -> GenerationResult:
        """Like :meth:`generate`, for a conversation rendered with the model's chat template.

        Message contents are text (see :meth:`chat_prompt`, and its opt-in
        ``parse_special_in_content``); ``system`` puts a system message first (``--system``).
        Unset settings: clearlm.sampling.defaults.chat_defaults (generation_config.json's, else
        ollama's T 0.8, top_k 40, top_p 0.9, repetition_penalty 1.1; ``temperature=0``: plain
        greedy). ``response_format``: structured output, and ``draft`` / ``prompt_lookup`` /
        ``num_draft``, as in :meth:`generate`.
        Raises ChatTemplateError when ``system`` is given and the messages start with one."""
        check_sampling_keywords(sampling, "chat")
        drafter = make_drafter(self, draft, prompt_lookup, num_draft)
        params = self.sampling_params(params, chat_defaults(self.generation_defaults, sampling),
                                      **sampling)
        grammar = self.grammar(response_format)
        ids = self.chat_prompt(with_system(messages, system), parse_special_in_content)
        stops = check_stop(stop)
        return run_generate(self, ids, params, max_new_tokens, stops, on_text, drafter, grammar)


def load(
    model: str | os.PathLike[str] | None = None,
    dtype: str | torch.dtype = torch.float32,
    check: Callable[[Model], object] | None = None,
    threads: int | None = None,
    device: str | torch.device | None = "cpu",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    weights: str | None = None,
    matmul_precision: str = "highest",
    activations: str | None = "float32",
    decode: str | None = None,
) -> Model:
    """Load a model from a .gguf file, a Hugging Face folder, or an alias.

    Args:
        model: a path to a GGUF file, a folder with config.json + safetensors +
            tokenizer.json, an alias (see ``clearlm.store.catalog.ALIASES``), or None (the default).
        dtype: parameter dtype: "float32" (reference numerics), "bfloat16" or "float16", or
            the torch dtype.
        check: called with a weightless Model (``transformer`` None; tokenizer, config and
            metadata set: enough for ``encode`` and ``chat_prompt``) before any weight is read;
            whatever it raises stops the load (the CLI refuses a missing chat template or a
            too-long prompt this way).
        threads: torch's intra-op thread count, set for the whole process
            (``torch.set_num_threads``); None applies the CLI's rule: ``$OMP_NUM_THREADS`` when
            set, else the free cores (:func:`clearlm.runtime.threads.set_threads`).
        device: "cpu", "cuda", "cuda:N", "mps" or "auto" (CUDA when present); the cache,
            masks, RoPE tables and sampling follow the weights there (clearlm.runtime.devices).
        tensor_parallel: N > 1 splits every matrix over the N ranks of a torchrun launch.
        pipeline_parallel: N > 1 splits the blocks so; every rank calls load and generate alike.
        weights: "compact" keeps a GGUF's block-quantized matrices (Q4_0 … Q6_K) packed as in
            the file and computes with kernels that read them (the GGUF's exact values, float32
            sums in another order); "float32" dequantizes every tensor (the reference path,
            today's parity baseline). None: compact with float32, float32 with a half dtype.
            Hugging Face folders and F32/F16 tensors are float either way; ``Model.weights``
            says which mode the model got and ``Model.weight_bytes`` what it holds.
        matmul_precision: "highest" (exact float32, default) or "medium" (prompts multiply in
            bfloat16, float32 sums: faster on AMX CPUs only, not exact; see
            clearlm.runtime.precision).
        activations: "float32" (exact, default) or "int8": compact layers round the inputs of
            decode-sized products (≤ 16 rows) to int8 per block of 32 values and multiply
            them with the codes in integers (AVX-512 VNNI or AVX2), as llama.cpp does: faster
            decode, not exact (clearlm.quant.linear.set_int8_activations). Where that kernel is
            not built (no C++ compiler, or neither instruction set) a warning says so and the
            products stay exact. None: "float32".
            ``Model.activations`` says which took effect.
        decode: "auto" (the compiled decode step when built, else built in a background
            process while decoding eagerly), "compiled" (built or loaded here, before this
            returns) or "eager" (the readable step only); None: ``$CLEARLM_DECODE``, else
            "auto". See :mod:`clearlm.api.decode`; a line about a background build or a failed
            one comes as a UserWarning.

    Raises:
        ModelNotFoundError, InvalidModelFileError, UnsupportedModelError: see clearlm.errors.
        SamplingParamsError: a bad dtype, weights, matmul_precision, activations or decode; compact
            with a half dtype; int8 activations without compact weights; threads < 1.
        DeviceError, DistributedError: no such device; a parallel launch failed. And what
            ``check`` raises.
    """
    dtype, where = parse_dtype(dtype), resolve_device(device)
    check_sizes(tensor_parallel, pipeline_parallel)  # before max(): "2" is an error, not a crash
    weights = parse_weights(weights, dtype, where, max(tensor_parallel, pipeline_parallel))
    precision = parse_matmul_precision(matmul_precision)
    activations = parse_activations(activations, weights, dtype)
    mode = parse_decode(decode)
    set_threads(threads)
    path = resolve_model(model)
    ckpt = open_checkpoint(path)
    # the header first (config, then tokenizer): a bad file fails before the slow part
    config, tokenizer = ckpt.config, ckpt.tokenizer
    if check is not None:
        weightless = Model(None, tokenizer, config, ckpt.metadata, {}, str(path))  # type: ignore[arg-type]
        check(weightless)
    loaded = load_placed(ckpt, dtype, where, tensor_parallel, pipeline_parallel, weights)
    set_matmul_precision(loaded.model, precision)  # "medium": prefill scoped (precision.py)
    if activations == "int8":
        activations = use_int8_activations(loaded.model, str(path))  # "float32": no kernel
    metadata = drop_vocab_arrays(loaded.metadata)  # the tokenizer holds the vocabulary
    m = Model(loaded.model, tokenizer, loaded.config, metadata, loaded.tensor_types,
              str(path), ckpt.generation_config.values, loaded.weights, loaded.weight_bytes,
              activations)
    step = attach_decode(m, mode, lambda line: warnings.warn(line, stacklevel=3))
    if mode == "compiled" and step is not None:
        step.prepare()  # before the first token
    return m
