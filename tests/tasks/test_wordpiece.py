"""WordPiece against hand-checked cases of google-research/bert's FullTokenizer."""

from runexp.tasks.vocabulary.wordpiece import WordPieceTokenizer, clean_text

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "want", "##want", "##ed", "wa", "un",
         "runn", "##ing", ",", "low", "lowest", "hello", "!", "how", "are", "you", "?", "hallo",
         "中", "国", "cafe", "x", "##x"]


def tokenizer(do_lower_case=True):
    return WordPieceTokenizer({t: i for i, t in enumerate(VOCAB)}, do_lower_case)


def test_reference_example_unwanted_running():
    # The example of BERT's tokenization_test.py.
    assert tokenizer().tokenize("UNwant\u00E9d,running") == [
        "un", "##want", "##ed", ",", "runn", "##ing"]


def test_lower_case_and_accent_stripping():
    assert tokenizer().basic_tokenize(" \tHeLLo!how  \n Are yoU?  ") == [
        "hello", "!", "how", "are", "you", "?"]
    assert tokenizer().basic_tokenize("H\u00E9llo") == ["hello"]


def test_no_lower_case_keeps_case_and_accents():
    assert tokenizer(False).basic_tokenize(" \tHeLLo!how  \n Are yoU?  ") == [
        "HeLLo", "!", "how", "Are", "yoU", "?"]
    assert tokenizer(False).basic_tokenize("H\u00E9llo") == ["H\u00E9llo"]


def test_cjk_characters_are_split():
    assert tokenizer().basic_tokenize("ah\u535A\u63A8zz") == ["ah", "\u535A", "\u63A8", "zz"]
    assert tokenizer().tokenize("中国cafe") == ["中", "国", "cafe"]


def test_punctuation_split_includes_ascii_symbols():
    assert tokenizer().basic_tokenize("a$b^c`d") == ["a", "$", "b", "^", "c", "`", "d"]


def test_unknown_and_partial_words_become_unk():
    tok = tokenizer()
    assert tok.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert tok.tokenize("unwantedZ running") == ["[UNK]", "runn", "##ing"]
    assert tok.tokenize("") == []


def test_longest_match_first_and_overlong_words():
    tok = tokenizer()
    assert tok.tokenize("lowest") == ["lowest"]
    assert tok.tokenize("x" * 200) == ["x"] + ["##x"] * 199
    assert tok.tokenize("x" * 201) == ["[UNK]"]


def test_control_characters_removed_and_whitespace_normalised():
    assert clean_text("a\x00b\ufffdc\u200bd\te\u00a0f") == "abcd e f"
    assert tokenizer().tokenize("hel\x00lo\u3000hallo") == ["hello", "hallo"]


def test_cache_gives_same_result():
    tok = tokenizer()
    assert tok.tokenize("Unwanted, unwanted") == tok.tokenize("Unwanted, unwanted")
