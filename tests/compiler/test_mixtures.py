"""Mixtures of pretraining tasks and dynamic masking, as the compiler plans and checks them."""

import pytest

from runexp.compiler.planner import compile_experiment
from tests.support.cli import errors_of


@pytest.fixture
def mixture(write, minimal):
    """(path, write): the minimal experiment training on a mixture of two tasks."""
    books = write("books.txt", "A book sentence.\nAnother.\n\nA second book.\n")
    books_held = write("books_held.txt", "Held-out book text.\n")
    path = write("mix.gin", f"""include '{minimal}'
wiki/bert_pretraining_task.train_files = '{write.corpus}'
wiki/bert_pretraining_task.validation_files = '{write.heldout}'
books/bert_pretraining_task.train_files = '{books}'
books/bert_pretraining_task.validation_files = '{books_held}'
mix/bert_pretraining_mixture.rates = {{'wiki': 0.7, 'books': 0.3}}
PRETRAIN_TASK = 'mix'
""")
    return path


def fingerprints(path, params=()):
    return {s.id: s.fingerprint for s in compile_experiment([path], list(params)).plan.stages}


def test_mixture_plans_one_vocab_a_preprocess_per_task_and_rates(mixture, write):
    plan = compile_experiment([mixture]).plan
    assert [s.id for s in plan.stages] == ["vocab", "preprocess.books", "preprocess.wiki",
                                           "pretrain", "evaluate", "export"]
    # One vocab, trained on every member's text.
    assert sorted(plan.stage("vocab").inputs["train_files"]) == sorted(
        [write.corpus, write.dir + "/books.txt"])
    pretrain = plan.stage("pretrain")
    assert pretrain.inputs["data_dirs"] == {t: plan.stage(f"preprocess.{t}").output_dir
                                            for t in ("books", "wiki")}
    assert "data_dir" not in pretrain.inputs
    assert pretrain.params["mixture"] == "mix"
    assert pretrain.params["mixture_rates"] == {"books": 0.3, "wiki": 0.7}
    assert pretrain.provenance["mixture_rates"].endswith("mix.gin:6")
    assert set(pretrain.deps) == {"vocab", "preprocess.books", "preprocess.wiki"}
    assert plan.stage("evaluate").inputs["data_dirs"] == pretrain.inputs["data_dirs"]
    assert plan.stage("preprocess.books").provenance["task"].startswith(
        "mix/bert_pretraining_mixture.rates @ ")


def test_a_single_task_plan_keeps_its_shape(minimal):
    plan = compile_experiment([minimal]).plan
    assert set(plan.stage("pretrain").inputs) == {"data_dir", "vocab_dir"}
    assert "mixture_rates" not in plan.stage("pretrain").params
    assert set(plan.stage("evaluate").inputs) == {"data_dir", "checkpoint_dir"}


def test_the_order_of_the_rates_dict_does_not_matter_but_a_rate_does(mixture, write):
    before = fingerprints(mixture)
    swapped = write("swapped.gin", f"include '{mixture}'\n"
                                   "mix/bert_pretraining_mixture.rates = {'books': 0.3, 'wiki': 0.7}\n")
    assert fingerprints(swapped) == before
    after = fingerprints(mixture, ["mix/bert_pretraining_mixture.rates = {'books': 0.5, 'wiki': 0.5}"])
    assert {k for k in before if before[k] != after[k]} == {"pretrain", "evaluate", "export"}


def test_a_member_without_held_out_text_is_left_out_of_evaluation(mixture, write):
    path = write("e.gin", f"include '{mixture}'\nbooks/bert_pretraining_task.validation_files = []\n")
    compiled = compile_experiment([path])
    assert compiled.plan.stage("evaluate").inputs["data_dirs"] == {
        "wiki": compiled.plan.stage("preprocess.wiki").output_dir}
    assert any("e.gin:2: warning: task 'books' has no held-out data: the evaluate stage leaves "
               "it out" in w for w in compiled.plan.warnings)


def test_unknown_task_in_a_mixture_suggests_a_registered_one(mixture, write):
    text = errors_of(write("e.gin", f"include '{mixture}'\n"
                                    "mix/bert_pretraining_mixture.rates = {'wikki': 1, 'books': 1}\n"))
    assert "e.gin:2: error: mix/bert_pretraining_mixture.rates names 'wikki', which is not a " \
           "registered bert_pretraining_task" in text
    assert "hint: did you mean 'wiki'?" in text


def test_train_task_may_name_a_mixture_and_a_typo_suggests_it(mixture, write):
    text = errors_of(write("e.gin", f"include '{mixture}'\nPRETRAIN_TASK = 'mixx'\n"))
    assert "e.gin:2: error: train.task names 'mixx'" in text
    assert "did you mean 'mix'?" in text


def test_a_name_that_is_both_task_and_mixture_is_refused(mixture, write):
    text = errors_of(write("e.gin", f"include '{mixture}'\n"
                                    f"mix/bert_pretraining_task.train_files = '{write.corpus}'\n"))
    assert "mix.gin:6: error: 'mix' is both a bert_pretraining_task and a " \
           "bert_pretraining_mixture" in text
    assert "hint: rename one of them" in text


@pytest.mark.parametrize("rates, message", [
    ("{'wiki': 0.7, 'books': 0}", "the rate of 'books' must be a positive number, got 0"),
    ("{'wiki': 0.7, 'books': -1.0}", "the rate of 'books' must be a positive number, got -1.0"),
    ("{'wiki': 0.7, 'books': 'x'}", "the rate of 'books' must be a positive number, got 'x'"),
    ("{}", "mix/bert_pretraining_mixture.rates is empty"),
    ("['wiki', 'books']", "mix/bert_pretraining_mixture.rates must be a dict"),
])
def test_bad_rates_are_refused(mixture, write, rates, message):
    text = errors_of(write("e.gin", f"include '{mixture}'\nmix/bert_pretraining_mixture.rates = "
                                    f"{rates}\n"))
    assert "e.gin:2: error: " in text and message in text


def test_a_mixture_of_mixtures_is_refused(mixture, write):
    text = errors_of(write("e.gin", f"include '{mixture}'\n"
                                    "big/bert_pretraining_mixture.rates = {'mix': 1, 'wiki': 1}\n"
                                    "PRETRAIN_TASK = 'big'\n"))
    assert "e.gin:2: error: big/bert_pretraining_mixture.rates: 'mix' is a mixture" in text


def test_members_must_share_sequence_length_and_predictions(mixture, write):
    text = errors_of(write("e.gin", f"include '{mixture}'\n"
                                    "wiki/bert_pretraining_task.max_seq_length = 64\n"
                                    "wiki/bert_pretraining_task.max_predictions_per_seq = 10\n"))
    assert "e.gin:2: error: mixture 'mix': task 'wiki' has max_seq_length = 64 but task " \
           "'books' has 128" in text
    assert "e.gin:3: error: mixture 'mix': task 'wiki' has max_predictions_per_seq = 10 but " \
           "task 'books' has 20" in text
    assert "one model reads every task's examples" in text


def test_dynamically_masked_members_must_share_how_they_are_masked(mixture, write):
    text = errors_of(write("e.gin", f"include '{mixture}'\n"
                                    "bert_pretraining_task.dynamic_masking = True\n"
                                    "books/bert_pretraining_task.masked_lm_prob = 0.2\n"
                                    "wiki/bert_pretraining_task.dynamic_masking = False\n"))
    assert "e.gin:4: error: mixture 'mix': task 'wiki' has dynamic_masking = False but task " \
           "'books' has True" in text
    text = errors_of(write("f.gin", f"include '{mixture}'\n"
                                    "bert_pretraining_task.dynamic_masking = True\n"
                                    "books/bert_pretraining_task.masked_lm_prob = 0.2\n"))
    assert "mixture 'mix': task 'wiki' has masked_lm_prob = 0.15 but task 'books' has 0.2" \
        in text


def test_dynamic_masking_rebuilds_preprocess_and_everything_after_it(minimal):
    before = fingerprints(minimal)
    after = fingerprints(minimal, ["bert_pretraining_task.dynamic_masking = True"])
    assert {k for k in before if before[k] != after[k]} == {
        "preprocess.pretrain", "pretrain", "evaluate", "export"}


def test_dynamic_masking_warns_that_dupe_factor_only_duplicates(minimal, write):
    path = write("e.gin", f"include '{minimal}'\nbert_pretraining_task.dynamic_masking = True\n")
    warnings = compile_experiment([path]).plan.warnings
    assert any("warning: pretrain: with dynamic_masking the train split is built in one pass; "
               "dupe_factor = 5 would only duplicate its instances" in w for w in warnings)
    quiet = write("q.gin", f"include '{path}'\nDUPE_FACTOR = 1\n")
    assert not any("dupe_factor" in w for w in compile_experiment([quiet]).plan.warnings)


def test_dynamic_masking_refuses_ngrams(minimal, write):
    text = errors_of(write("e.gin", f"include '{minimal}'\n"
                                    "bert_pretraining_task.dynamic_masking = True\n"
                                    "bert_pretraining_task.ngram_max = 3\n"))
    assert "e.gin:3: error: pretrain: dynamic_masking masks single tokens or whole words, not " \
           "n-grams (ngram_max = 3)" in text
