"""Every user error names the file and line, shows the source line, and says what to do."""

import pytest

from runexp.compiler.errors import UserError
from runexp.compiler.planner import compile_experiment
from tests.support.cli import errors_of


def test_unknown_configurable_suggests_the_close_name(write, minimal):
    path = write("e.gin", f"include '{minimal}'\ntrian.steps = 5\n")
    text = errors_of(path)
    assert "e.gin:2: error: unknown configurable 'trian'" in text
    assert "    trian.steps = 5\n    ^" in text
    assert "hint: did you mean 'train'?" in text


def test_unknown_parameter_suggests_the_close_name(write, minimal):
    path = write("e.gin", f"include '{minimal}'\ntrain.stpes = 5\n")
    text = errors_of(path)
    assert "e.gin:2: error: 'train' has no parameter 'stpes'" in text
    assert "did you mean 'steps'?" in text


def test_missing_required_macro_points_at_where_it_is_required(write):
    path = write("e.gin", "include 'runs/pretrain.gin'\nCORPUS_FILES = 'x.txt'\n")
    text = errors_of(path)
    assert "gin/runs/pretrain.gin:20: error: OUTPUT_ROOT (used by experiment.output_root) is required but not set" in text
    assert "OUTPUT_ROOT = %gin.REQUIRED" in text


def test_wrong_type_names_the_parameter_and_the_expected_type(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nTRAIN_STEPS = 'many'\n"))
    assert "e.gin:2: error: train.steps must be an integer, got 'many'" in text


def test_float_where_an_integer_is_needed_says_how_to_fix(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nBATCH_SIZE = 8.0\n"))
    assert "train.batch_size must be an integer, got 8.0" in text
    assert "hint: write 8 without the decimal point" in text


def test_zero_and_negative_counts_are_refused(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nTRAIN_STEPS = 0\nDUPE_FACTOR = -1\n"))
    assert "e.gin:2: error: train.steps must be positive, got 0" in text
    assert "e.gin:3: error: pretrain/bert_pretraining_task.dupe_factor must be positive, got -1" in text


def test_all_errors_of_a_compile_are_reported_at_once(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nfoo.bar = 1\ntrain.stepz = 2\n"
                                     "MASKED_LM_PROB = 2.0\n"))
    assert "unknown configurable 'foo'" in text
    assert "'train' has no parameter 'stepz'" in text
    assert "bert_pretraining_task.masked_lm_prob must be at most 1.0, got 2.0" in text
    assert "3 errors." in text


def test_missing_include_says_where_it_looked(write):
    text = errors_of(write("e.gin", "include 'nowhere.gin'\n"))
    assert "e.gin:1: error: gin file 'nowhere.gin' not found" in text
    assert "--gin_search_path" in text


def test_circular_include_shows_the_chain(write):
    write("a.gin", "include 'b.gin'\n")
    write("b.gin", "include 'a.gin'\n")
    text = errors_of(write.dir + "/a.gin")
    assert "b.gin:1: error: circular include: a.gin -> b.gin -> a.gin" in text.replace(
        write.dir + "/", "")


def test_non_utf8_file_names_the_line(write):
    path = write("e.gin", b"TRAIN_STEPS = 1\nNAME = '\xff'\n")
    text = errors_of(path)
    assert "e.gin:2: error: gin file is not valid UTF-8" in text
    assert "save the file as UTF-8" in text


def test_syntax_error_has_file_line_and_caret(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\ntrain.steps = = 3\n"))
    assert "e.gin:2:" in text and "gin syntax error" in text
    assert "train.steps = = 3" in text and "^" in text


def test_undefined_macro_suggests_a_defined_one(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\ntrain.steps = %TRAIN_STEP\n"))
    assert "e.gin:2: error: undefined macro %TRAIN_STEP" in text
    assert "did you mean 'TRAIN_STEPS'" in text


def test_unknown_task_name_suggests_a_registered_one(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nPRETRAIN_TASK = 'pretrian'\n"))
    assert "e.gin:2: error: train.task names 'pretrian', which is not a registered " \
           "bert_pretraining_task" in text
    assert "did you mean 'pretrain'?" in text


def test_unknown_accelerator_profile(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nACCELERATOR = 'tpu_v3'\n"))
    assert "e.gin:2: error: unknown accelerator profile 'tpu_v3'" in text
    assert "did you mean" in text and "'tpu_v3_8'" in text


def test_tpu_with_a_local_output_root_is_refused(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\ninclude 'accelerators/tpu_v3_8.gin'\n"))
    assert "error: a TPU (tpu_v3_8) cannot write to the local path" in text
    assert "set OUTPUT_ROOT = 'gs://BUCKET/PATH'" in text


def test_batch_not_divisible_by_replicas(write):
    path = write("e.gin", """
        include 'runs/pretrain.gin'
        include 'accelerators/tpu_v3_8.gin'
        OUTPUT_ROOT = 'gs://bucket/exp'
        CORPUS_FILES = 'gs://bucket/corpus/*.txt'
        BATCH_SIZE = 100
        """)
    text = errors_of(path)
    assert "e.gin:6: error: global batch size 100 is not divisible by the 8 replicas of " \
           "tpu_v3_8" in text
    assert "e.g. 104" in text


def test_model_vocab_smaller_than_vocabulary_suggests_padded_size(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nVOCAB_SIZE = 30000\n"
                                     "model.vocab_size = 20000\n"))
    assert "e.gin:3: error: model.vocab_size (20000) is smaller than the vocabulary (30000 " \
           "tokens)" in text
    assert "set model.vocab_size = 30080" in text


def test_sequence_longer_than_position_embeddings(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nMAX_SEQ_LENGTH = 1024\n"))
    assert "e.gin:2: error: max_seq_length (1024) exceeds the model's max_position_embeddings " \
           "(512)" in text


def test_more_predictions_than_tokens(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nMAX_SEQ_LENGTH = 16\n"
                                     "MAX_PREDICTIONS_PER_SEQ = 20\n"))
    assert "e.gin:3: error: max_predictions_per_seq (20) exceeds max_seq_length (16)" in text


def test_corpus_glob_that_matches_nothing(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nCORPUS_FILES = '{write.dir}/no/*.txt'\n"))
    assert "e.gin:2: error: pretrain.train_files: " in text and "matches no file" in text


def test_unknown_finetune_task(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nfinetune.task = 'mnli'\n"
                                     "mnlii/classification_task.train_file = 'a.tsv'\n"))
    assert "e.gin:2: error: finetune.task names 'mnli', which is not a registered " \
           "classification_task" in text
    assert "did you mean 'mnlii'?" in text


def test_checkpoint_cadence_must_fit_steps_per_loop(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\ntrain.steps_per_loop = 4\n"))
    assert "error: checkpoint_every (10) is not a multiple of steps_per_loop (4)" in text


def test_scope_on_an_unscoped_configurable(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nfoo/train.steps = 3\n"))
    assert "e.gin:2: error: 'train' cannot be scoped (foo/train)" in text


def test_bad_gin_param_is_located_as_a_flag(minimal):
    with pytest.raises(UserError) as info:
        compile_experiment([minimal], ["TRAIN_STEPS='x'"])
    assert "--gin_param[1]:1: error: train.steps must be an integer, got 'x'" in info.value.render()


def test_bad_choice_lists_the_allowed_values(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nMODEL_SIZE = 'huge'\n"))
    assert "e.gin:2: error: model.size must be one of 'tiny', 'mini', 'small', 'medium', " \
           "'base', 'large'; got 'huge'" in text


def test_lower_casing_with_a_cased_vocab_is_refused(write, minimal):
    vocab = write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nThe\nthe\nParis\n##s\n")
    text = errors_of(write("e.gin", f"include '{minimal}'\nVOCAB = '{vocab}'\n"))
    assert "error: DO_LOWER_CASE is True but the vocab is cased (2 of 4 tokens have capitals)" in text
    assert "set DO_LOWER_CASE = False for a cased vocab" in text


def test_adopted_vocab_size_is_counted(write, minimal):
    vocab = write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nparis\n##s\n")
    plan = compile_experiment([write("e.gin", f"include '{minimal}'\nVOCAB = '{vocab}'\n")]).plan
    assert plan.stage("pretrain").params["model"]["vocab_size"] == 8
    assert plan.stage("vocab").provenance["vocab_size"] == "counted in vocab.txt"


def test_finetune_labels_missing_from_the_task_are_reported(write, minimal):
    train = write("train.tsv", "label\tsentence\npos\tgood\nneg\tbad\nmeh\tso so\n")
    path = write("e.gin", f"""include '{minimal}'
finetune.task = 'sst'
sst/classification_task.train_file = '{train}'
sst/classification_task.dev_file = '{train}'
sst/classification_task.labels = ['pos', 'neg']
""")
    text = errors_of(path)
    assert "e.gin:5: error: sst: the training data has 3 labels, 1 of them not in " \
           "sst/classification_task.labels: 'meh'" in text


def test_gradient_accumulation_must_split_the_batch(write):
    path = write("e.gin", """
        include 'runs/pretrain.gin'
        include 'accelerators/tpu_v3_8.gin'
        OUTPUT_ROOT = 'gs://bucket/exp'
        CORPUS_FILES = 'gs://bucket/corpus/*.txt'
        BATCH_SIZE = 24
        train.grad_accum_steps = 2
        train.compute_dtype = 'mixed_float16'
        """)
    text = errors_of(path)
    assert "e.gin:7: error: global batch size 24 cannot be split into 2 micro-batches across " \
           "8 replica(s)" in text
    assert "e.gin:8: error: mixed_float16 is for GPUs; TPUs compute in bfloat16" in text


def test_a_task_name_is_one_scope(write, minimal):
    text = errors_of(write("e.gin", f"include '{minimal}'\nsst/dev/classification_task.train_file = 'x'\n"))
    assert "e.gin:2: error: task name 'sst/dev' has a '/': a task is named by one scope" in text
    assert "hint: use sst_dev/classification_task.train_file = ..." in text


def test_a_macro_nothing_uses_is_an_error_with_the_close_name(write, minimal):
    path = write("e.gin", f"include '{minimal}'\n")
    text = errors_of(path, ["TRAIN_STEP=20"])
    assert "--gin_param[1]:1: error: macro TRAIN_STEP is set but nothing uses it" in text
    assert "did you mean 'TRAIN_STEPS'" in text
    text = errors_of(write("f.gin", f"include '{minimal}'\nMY_LEFTOVER = 3\n"))
    assert "f.gin:2: error: macro MY_LEFTOVER is set but nothing uses it" in text
