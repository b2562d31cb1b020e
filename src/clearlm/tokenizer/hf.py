"""Tokenizer of a Hugging Face model folder.

Files read (as transformers' ``AutoTokenizer.from_pretrained(folder)`` reads them):
- ``tokenizer.json``: the whole `tokenizers` pipeline, its post-processor included;
- ``tokenizer_config.json``: named special tokens (``bos_token``: '<s>' or {'content': '<s>'};
  one missing from tokenizer.json is added as special), ``added_tokens_decoder`` (flags override
  tokenizer.json's, but a token once special stays skippable: `tokenizers` keeps a set of special
  texts that adding a token again does not shrink), ``chat_template`` (a string, or a list of
  {'name', 'template'}), ``add_bos_token`` / ``add_eos_token``;
- ``chat_template.jinja`` and ``additional_chat_templates/*.jinja`` (they win over the config);
- ``config.json`` and ``generation_config.json``: ``eos_token_id`` (an int or a list); every
  id that ends generation is their union with ``eos_token`` (:mod:`clearlm.tokenizer.end_ids`).

BOS/EOS: tokenizer.json's post-processor decides, and ``add_bos_token`` is ignored when there is
one, as in transformers 5 (which pops the flags whenever tokenizer.json exists): so BOS is never
added twice. Only when tokenizer.json has no post-processor do the flags add BOS/EOS (transformers
5 then adds nothing; transformers 4's Llama/Gemma classes honoured them).
``clean_up_tokenization_spaces`` is not applied (it is lossy; modern LLM configs set it false).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from clearlm.errors import InvalidModelFileError, ModelNotFoundError, UnsupportedModelError
from clearlm.tokenizer.core import Tokenizer
from clearlm.tokenizer.end_ids import id_list
from clearlm.tokenizer.gguf import bos_eos_processor
from clearlm.tokenizer.token_table import TokenTable

_ADDED_TOKEN_FLAGS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; {} if it does not exist.

    Raises:
        InvalidModelFileError: the file is not a JSON object (message names it).
    """
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidModelFileError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise InvalidModelFileError(f"{path} is not a JSON object")
    return value


def _added_token(value: str | dict[str, Any]) -> AddedToken:
    """A config token: a string (special, not normalized, as transformers makes it) or a dict
    of AddedToken fields ('__type' and unknown keys are ignored)."""
    if isinstance(value, str):
        return AddedToken(value, special=True, normalized=False)
    return AddedToken(**{k: v for k, v in value.items() if k in _ADDED_TOKEN_FLAGS})


def _named_tokens(config: dict[str, Any]) -> dict[str, AddedToken]:
    """'bos_token', 'eos_token', ... and model-specific '*_token' entries that name a token."""
    return {
        key: _added_token(value)
        for key, value in config.items()
        if key.endswith("_token")
        and (isinstance(value, str) or (isinstance(value, dict) and "content" in value))
    }


def _chat_templates(folder: Path, config: dict[str, Any]) -> dict[str, str]:
    """name → template; the unnamed one is 'default'."""
    value = config.get("chat_template")
    if isinstance(value, list):  # [{'name': 'default', 'template': '...'}, ...]
        templates = {t["name"]: t["template"] for t in value}
    elif isinstance(value, dict):
        templates = dict(value)
    else:
        templates = {"default": value} if isinstance(value, str) else {}
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        templates.update({f.stem: _read_template(f) for f in extra.glob("*.jinja")})
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        templates["default"] = _read_template(jinja)
    return templates


def _read_template(path: Path) -> str:
    """A .jinja file as transformers reads it: UTF-8, with open()'s universal newlines (a CRLF
    template renders with LF, as in transformers); the one text file not kept byte for byte.

    Raises:
        InvalidModelFileError: the file is not UTF-8.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidModelFileError(f"{path} is not UTF-8 text ({e})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _end_ids(folder: Path, tokenizer_size: int) -> set[int]:
    """eos_token_id (an int or a list) of config.json (and its text_config, as multimodal
    configs such as Gemma 3's nest it) and generation_config.json, all together.

    Every id must lie in the model's vocabulary (config.json's vocab_size, else the
    tokenizer's size): InvalidModelFileError naming the file otherwise, as for GGUF."""
    model = _read_json(folder / "config.json")
    vocab = next(
        (
            part["vocab_size"]
            for part in (model, model.get("text_config"))
            if isinstance(part, dict) and type(part.get("vocab_size")) is int
        ),
        tokenizer_size,
    )
    ends: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        config = _read_json(folder / name)
        for part in (config, config.get("text_config")):
            if isinstance(part, dict):
                where = f"{folder / name}: eos_token_id"
                ends |= set(id_list(part.get("eos_token_id"), where, vocab))
    return ends


def _register_tokens(
    backend: Backend, config: dict[str, Any], path: Path
) -> tuple[dict[str, AddedToken], set[int]]:
    """Apply the config's tokens to ``backend``, as transformers does; return the named special
    tokens and the ids ``decode(skip_special_tokens=True)`` drops.

    ``added_tokens_decoder`` flags win over tokenizer.json's (a differing token is added again),
    but `tokenizers` never forgets that a text was special, so decode still skips it. Named
    tokens (bos_token, ...) and additional_special_tokens not yet added become special tokens.
    """
    current = backend.get_added_tokens_decoder()
    special = {i for i, a in current.items() if a.special}
    for key, spec in (config.get("added_tokens_decoder") or {}).items():
        if not key.isdigit() or not isinstance(spec, dict | str):
            raise InvalidModelFileError(f"{path}: bad added_tokens_decoder entry {key!r}")
        token = _added_token(spec)
        have = current.get(int(key))
        if have is None or repr(have) != repr(token):
            backend.add_tokens([token])
    named = _named_tokens(config)
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    wanted = [*named.values(), *(_added_token(t) for t in extra if isinstance(t, str | dict))]
    added = {a.content for a in backend.get_added_tokens_decoder().values()}
    backend.add_tokens([t for t in wanted if t.content not in added])
    special |= {i for i, a in backend.get_added_tokens_decoder().items() if a.special}
    return named, special


def _bos_eos(
    backend: Backend, config: dict[str, Any], named: dict[str, AddedToken]
) -> tuple[int | None, int | None, bool, bool]:
    """(bos_id, eos_id, add_bos, add_eos). The post-processor decides what encode adds; without
    one, add_bos_token / add_eos_token install one. add_* are then read off an encoding."""
    bos_text = named["bos_token"].content if "bos_token" in named else None
    eos_text = named["eos_token"].content if "eos_token" in named else None
    bos = backend.token_to_id(bos_text) if bos_text is not None else None
    eos = backend.token_to_id(eos_text) if eos_text is not None else None
    if backend.post_processor is None:  # (an id implies its text)
        want_bos = bos is not None and bool(config.get("add_bos_token"))
        want_eos = eos is not None and bool(config.get("add_eos_token"))
        if want_bos or want_eos:
            backend.post_processor = bos_eos_processor(
                (bos_text, bos) if want_bos else None, (eos_text, eos) if want_eos else None
            )
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    add_bos = bos is not None and full[:1] == [bos] and plain[:1] != [bos]
    add_eos = eos is not None and full[-1:] == [eos] and plain[-1:] != [eos]
    return bos, eos, add_bos, add_eos


def tokenizer_from_hf_folder(folder: str | Path) -> Tokenizer:
    """Build the tokenizer of a Hugging Face model folder: tokenizer.json, with
    tokenizer_config.json, chat_template.jinja and generation_config.json when present.

    Raises:
        ModelNotFoundError: the folder or its tokenizer.json does not exist.
        UnsupportedModelError: the folder has only a SentencePiece tokenizer.model.
        InvalidModelFileError: a file is not valid JSON or not a `tokenizers` pipeline.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelNotFoundError(f"model folder not found: {folder}")
    path = folder / "tokenizer.json"
    if not path.is_file():
        if (folder / "tokenizer.model").is_file():
            raise UnsupportedModelError(
                f"{folder} has a SentencePiece tokenizer.model but no tokenizer.json; clearlm "
                "needs tokenizer.json (write it with transformers: "
                "AutoTokenizer.from_pretrained(folder).save_pretrained(folder))"
            )
        raise ModelNotFoundError(f"{folder} has no tokenizer.json")
    try:
        backend = Backend.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON or unknown fields
        raise InvalidModelFileError(f"{path} is not a tokenizers pipeline ({e})") from None
    config_path = folder / "tokenizer_config.json"
    config = _read_json(config_path)
    named, special = _register_tokens(backend, config, config_path)
    bos, eos, add_bos, add_eos = _bos_eos(backend, config, named)
    size = max(backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    ends = _end_ids(folder, size) | ({eos} if eos is not None else set())
    templates = _chat_templates(folder, config)
    return Tokenizer(
        backend=backend,
        tokens=TokenTable.of(backend.id_to_token(i) or "" for i in range(size)),
        special_ids=frozenset(special),
        bos_id=bos,
        eos_id=eos,
        eos_ids=frozenset(ends),
        add_bos=add_bos,
        add_eos=add_eos,
        chat_template=templates.pop("default", None),
        source=str(folder),
        special_tokens={k: t.content for k, t in named.items()},
        chat_templates=templates,
    )
