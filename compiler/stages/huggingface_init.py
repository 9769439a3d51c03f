"""An ``init_checkpoint`` that is a Hugging Face BERT directory, as the planner sees it.

``init_checkpoint`` names either a checkpoint prefix in google-research/bert's layout
(``.../bert_model.ckpt``: ``.index`` and ``.data-*`` files beside it) or a directory that
transformers' ``save_pretrained`` wrote (``config.json``, ``model.safetensors``, tokenizer
files). Which one is decided by what is there: a local directory holding ``config.json``, or
a gs:// prefix under which ``config.json`` is listed. When gs:// cannot be asked (``--offline``,
no credentials), by the name: a last segment without ``ckpt`` is taken for a directory.

The directory's ``config.json`` and tokenizer files are read here (compiler/formats/huggingface_dir.py:
standard library only; gs:// through runexp's storage layer) so that the dry run checks the
model size, the vocabulary and the casing against the experiment before anything runs, and
so that the model's activation and, when ``VOCAB`` is unset, the vocabulary and casing come
from it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from runexp.compiler import uris
from runexp.compiler.errors import Location
from runexp.compiler.formats.huggingface_dir import (CONFIG_FILE, HuggingFaceDir, HuggingFaceDirError,
                                             read_huggingface_dir)
from runexp.compiler.stages.common import PlanContext
from runexp.runtime import storage


@dataclasses.dataclass(frozen=True)
class HuggingFaceInit:
    """An init_checkpoint found to be a Hugging Face directory.

    Attributes:
      path: the directory, as in the plan.
      record: what its files say; None when they could not be read now (gs:// offline) or
        were refused (``refused``: the error is already reported).
    """

    path: str
    record: Optional[HuggingFaceDir]
    refused: bool = False


def is_google_prefix_name(init: str) -> bool:
    """A checkpoint prefix by its name (``bert_model.ckpt``, ``model.ckpt-1000``)."""
    return "ckpt" in init.rstrip("/").rsplit("/", 1)[-1]


def init_checkpoint(ctx: PlanContext, configurable: str) -> Optional[str]:
    """The init_checkpoint bound for ``configurable`` ("train" or "finetune"), absolute."""
    init = ctx.r.get(configurable, "init_checkpoint")
    return None if init is None else uris.absolute(init)


def huggingface_init(ctx: PlanContext, init: str,
                     location: Optional[Location]) -> Optional[HuggingFaceInit]:
    """The Hugging Face directory ``init`` names, read; None for a Google checkpoint prefix.
    Problems with the directory are errors at ``location``."""
    if init not in ctx.huggingface_inits:
        ctx.huggingface_inits[init] = _read(ctx, init, location)
    return ctx.huggingface_inits[init]


def _read(ctx: PlanContext, init: str, location) -> Optional[HuggingFaceInit]:
    config = init.rstrip("/") + "/" + CONFIG_FILE
    if not uris.is_gcs(init):
        if not os.path.isdir(init):
            return None
        if not os.path.isfile(config):
            ctx.c.error(f"init_checkpoint {init} is a directory without {CONFIG_FILE}", location,
                        hint="give a Hugging Face model directory (what save_pretrained "
                             "writes), or a checkpoint prefix in Google's layout, e.g. "
                             f"{init.rstrip('/')}/bert_model.ckpt")
            return HuggingFaceInit(init, None, refused=True)
        return _record(ctx, init, location)
    found = ctx.gcs.exists(config)
    if found is None:  # storage cannot be asked now: by the name
        return None if is_google_prefix_name(init) else HuggingFaceInit(init, None)
    return _record(ctx, init, location) if found else None


def _record(ctx: PlanContext, init: str, location) -> Optional[HuggingFaceInit]:
    kwargs = {}
    if uris.is_gcs(init):
        # The directory's listing (made once for the fingerprint) answers "exists" without a
        # request per file.
        listing = ctx.gcs.directory(init)
        exists = listing.__contains__ if isinstance(listing, dict) else storage.exists
        kwargs = {"read_text": storage.read_text, "exists": exists}
    try:
        record = read_huggingface_dir(init.rstrip("/"), **kwargs)
    except HuggingFaceDirError as e:
        ctx.c.error(f"init_checkpoint: {e.file}: {e.message}", location, hint=e.hint)
        return HuggingFaceInit(init, None, refused=True)  # one error, not a second as Google's
    return HuggingFaceInit(init, record)
