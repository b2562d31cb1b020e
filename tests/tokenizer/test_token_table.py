"""TokenTable (a vocabulary as one UTF-8 buffer and offsets) behaves as the list of token strings
it replaces: against a plain list of awkward strings, and against the GGUF's own
``tokenizer.ggml.tokens`` array and transformers' tokenizer for SmolLM2."""

from __future__ import annotations

import pickle
import sys

import pytest
from test_tokenizer import gguf_metadata

from clearlm.tokenizer.token_table import TokenTable

# Empty, ASCII, byte-level BPE spelling, SentencePiece spelling, CJK, emoji with ZWJ, a lone
# surrogate (a GGUF may hold one; the table must give it back, not fail or replace it).
STRINGS = ["", "a", "Ġhello", "▁world", "<0xE4>", "中文", "👨‍👩‍👧", "\ud800", "<|im_end|>", ""]


def test_table_matches_the_list_it_replaces() -> None:
    table = TokenTable.of(STRINGS)
    assert len(table) == len(STRINGS)
    assert table == STRINGS and list(table) == STRINGS
    assert [table[i] for i in range(len(STRINGS))] == STRINGS
    assert [table[-i] for i in range(1, len(STRINGS) + 1)] == [STRINGS[-i] for i in range(1, 11)]
    for s in (slice(None), slice(2, 5), slice(None, None, -3), slice(8, 100)):
        assert table[s] == STRINGS[s]
    assert table != STRINGS[:-1] and table != [*STRINGS[:-1], "x"]
    assert table.index("中文") == STRINGS.index("中文") and "▁world" in table


@pytest.mark.parametrize("bad", [10, -11, 2**40])
def test_out_of_range_id_raises_index_error(bad: int) -> None:
    with pytest.raises(IndexError, match=f"token id {bad} out of range for a vocabulary of 10"):
        TokenTable.of(STRINGS)[bad]


def test_non_integer_index_raises_type_error() -> None:
    table = TokenTable.of(STRINGS)
    with pytest.raises(TypeError):
        table[1.0]  # type: ignore[index]
    with pytest.raises(TypeError):
        hash(table)


def test_empty_table() -> None:
    table = TokenTable.of([])
    assert len(table) == 0 and list(table) == [] and table == [] and table[:] == []
    with pytest.raises(IndexError):
        table[0]


def test_smollm2_table_equals_the_gguf_array_and_transformers(
    smollm2, smollm2_path, hf_smollm2_tokenizer
) -> None:
    tok = smollm2.tokenizer
    reference = gguf_metadata(smollm2_path)["tokenizer.ggml.tokens"]  # list[str], from gguf-py
    assert isinstance(tok.tokens, TokenTable)
    assert tok.tokens == reference and tok.vocab_size == len(reference) == 49152
    ids = [0, 1, 2, 100, 12345, 49151, -1]
    assert [tok.id_to_token(i) for i in ids] == [reference[i] for i in ids]
    assert [tok.id_to_token(i) for i in ids[:-1]] == hf_smollm2_tokenizer.convert_ids_to_tokens(
        ids[:-1]
    )
    # the pipeline's own spelling (what streaming decodes) agrees, and ids outside give None
    assert [tok.piece(i) for i in ids[:-1]] == [reference[i] for i in ids[:-1]]
    assert tok.piece(-1) is None and tok.piece(49152) is None
    # what the table exists for: far fewer bytes than the list of str objects
    list_bytes = sys.getsizeof(reference) + sum(map(sys.getsizeof, reference))
    assert tok.tokens.nbytes < list_bytes / 5


def test_table_pickles() -> None:
    table = TokenTable.of(STRINGS)
    assert pickle.loads(pickle.dumps(table)) == STRINGS
