"""Which piece of a SentencePiece model plays each of BERT's special roles. The plan names
them (compiler/stages/vocab.py) and the tokenizer uses them (tasks/vocabulary/tokenizer.py); no
TensorFlow, and the model is read by the caller's ``sentencepiece`` processor."""

from __future__ import annotations

from runexp.compiler.specs.vocab import SPECIAL_TOKENS

MISSING_ROLES_HINT = (
    "BERT needs [CLS], [SEP] and [MASK] for its inputs and masks, an unknown piece and a "
    "padding piece; train the model with control_symbols=[CLS],[SEP],[MASK] and pad_id=0 "
    "(as ALBERT's: pad_id=0, unk_id=1), or let runexp train one (VOCAB = None)")


def sentencepiece_roles(processor) -> tuple[dict[str, int], list[str]]:
    """Which piece of a SentencePiece model plays each of BERT's special roles.

    ``[UNK]`` is the model's unknown piece (what SentencePiece makes of text it cannot
    spell) and ``[PAD]`` its padding piece, whatever their spelling (``<unk>`` and
    ``<pad>`` in ALBERT's and T5's models; a model without a padding id may have a piece
    spelled ``[PAD]``). ``[CLS]``, ``[SEP]`` and ``[MASK]`` are pieces spelled so (control
    symbols, as ALBERT's, or user-defined ones).

    Args:
      processor: a ``sentencepiece.SentencePieceProcessor``.

    Returns:
      ({role: id} of the roles some piece plays, in SPECIAL_TOKENS order; [the roles no
      piece plays]).
    """
    size = processor.get_piece_size()

    def spelled(token: str):
        i = processor.piece_to_id(token)  # unknown spellings give the unknown piece's id
        return i if processor.id_to_piece(i) == token else None

    pad = processor.pad_id()
    found = {"[PAD]": pad if 0 <= pad < size else spelled("[PAD]"),
             "[UNK]": processor.unk_id()}
    found.update({t: spelled(t) for t in SPECIAL_TOKENS[2:]})
    return ({t: i for t, i in found.items() if i is not None},
            [t for t, i in found.items() if i is None])
