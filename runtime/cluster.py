"""Multi-worker training: which process this is, from TF_CONFIG (no TensorFlow import).

Every worker runs the same `runexp` command with its own TF_CONFIG, e.g.
    TF_CONFIG='{"cluster": {"worker": ["host0:2222", "host1:2222"]},
                "task": {"type": "worker", "index": 0}}'
The chief (task "chief", or worker 0 when the cluster has no "chief") builds every stage and
writes every output; the other workers wait for the stages before training, join each
training stage (MultiWorkerMirroredStrategy all-reduces their gradients), and write nothing
under the output root.
"""

from __future__ import annotations

import json
import os
from typing import Optional


def tf_config() -> Optional[dict]:
    """TF_CONFIG parsed, when it names a cluster of more than one task; else None."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from None
    tasks = sum(len(v) for v in (config.get("cluster") or {}).values())
    return config if tasks > 1 else None


def is_multi_worker() -> bool:
    return tf_config() is not None


def is_chief() -> bool:
    """True unless TF_CONFIG makes this process a non-chief member of a cluster."""
    config = tf_config()
    if config is None:
        return True
    task = config.get("task") or {}
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if kind == "chief":
        return True
    return kind == "worker" and index == 0 and "chief" not in config.get("cluster", {})


def worker_name() -> str:
    config = tf_config() or {}
    task = config.get("task") or {}
    return f"{task.get('type', 'worker')} {task.get('index', 0)}"
