"""One exception hierarchy for every user-facing failure.

The CLI catches :class:`ClearLMError` and prints ``error: <message>`` on one line with a non-zero
exit code; the Python API raises the typed subclass so callers can tell the cases apart.

Exit codes: 1 other, 2 command-line usage (unknown option, missing argument, bad number),
3 model not found, 4 invalid model file, 5 unsupported model, 6 context length, 7 invalid
sampling or generation settings, 8 chat template, 9 pull failed, 10 device not available,
11 distributed run failed.
"""

import unicodedata


def printable(text: str) -> str:
    """text with control characters and line separators escaped the way repr() writes them
    (newline → \\n, ESC → \\x1b), so a path or value quoted in a message keeps it one line and
    cannot drive the terminal."""
    return "".join(
        c.encode("unicode_escape").decode("ascii")
        if unicodedata.category(c) in ("Cc", "Zl", "Zp")
        else c
        for c in text
    )


class ClearLMError(Exception):
    """Base class: a problem with the user's input or environment, with a one-line message.

    The message is passed through :func:`printable`: whatever file name or value it quotes,
    it stays one line."""

    exit_code = 1

    def __init__(self, *args: object) -> None:
        super().__init__(*(printable(a) if isinstance(a, str) else a for a in args))


class ModelNotFoundError(ClearLMError):
    """The model path does not exist, or an alias names a package that is not installed."""

    exit_code = 3


class InvalidModelFileError(ClearLMError):
    """The file exists but is not a readable GGUF (wrong magic, truncated, corrupt)."""

    exit_code = 4


class UnsupportedModelError(ClearLMError):
    """The file is valid but uses an architecture, tensor type or setting clearlm does not run."""

    exit_code = 5


class ContextLengthError(ClearLMError):
    """The prompt (plus what must be generated) does not fit in the model's context window."""

    exit_code = 6


class SamplingParamsError(ClearLMError, ValueError):
    """A sampling or generation setting is out of range (negative temperature, top_p outside
    (0, 1], negative max_new_tokens, an unknown dtype, ...)."""

    exit_code = 7


class GrammarError(SamplingParamsError):
    """Structured output: the grammar (or JSON schema) cannot be followed, because the grammar
    engine gives up on it (a rule that forces endless output, such as ``root ::= "a" root``,
    or a required property whose schema refers back to its object). Raised when the grammar
    state is made when the engine can tell then, else at the step that fails; the batch engine
    ends that sequence alone (finish reason "error")."""


class SamplingError(ClearLMError, ValueError):
    """The logits give no distribution to sample from: a row is all -inf (every token removed),
    or holds NaN or +inf."""


class PromptTypeError(ClearLMError, TypeError):
    """A prompt that is neither a string nor a list of token ids, or a list of prompts that is
    empty or holds something else (``["a", 5]``)."""

    exit_code = 7


class ChatTemplateError(ClearLMError):
    """The model has no chat template, or its template failed on these messages."""

    exit_code = 8


class PullError(ClearLMError):
    """``clearlm pull`` failed: pip failed, assembly failed, or the disk is full."""

    exit_code = 9


class ChecksumError(PullError):
    """An assembled file's sha256 is not the one the alias table expects."""


class DeviceError(ClearLMError):
    """A ``device`` torch does not have here (``cuda`` on a CPU-only build, ``cuda:3`` with two
    GPUs, ``mps`` off Apple silicon), or a name torch does not know."""

    exit_code = 10


class CacheKeyError(ClearLMError, KeyError):
    """A key that is not in an activation cache (``run_with_cache``'s), or a layer outside the
    model's blocks. A KeyError too, so ``in`` and ``.get`` work as on any mapping; its message
    is printed as written (KeyError would quote it)."""

    __str__ = Exception.__str__


class DistributedError(ClearLMError):
    """Running across processes failed: the rendezvous could not be reached, a rank died or
    stopped answering within the timeout, or the parallel options do not fit the launch."""

    exit_code = 11
