"""Preset BERT encoder sizes (Google's BERT miniatures plus base and large)."""

from __future__ import annotations

# name -> (layers, hidden, heads). Intermediate size is 4 x hidden, as in every preset.
MODEL_SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def bert_config(size: str, overrides: dict) -> dict:
    """Google's bert_config.json fields for a preset, with non-None overrides applied."""
    layers, hidden, heads = MODEL_SIZES[size]
    config = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
    }
    config.update({k: v for k, v in overrides.items() if v is not None})
    if overrides.get("hidden_size") and not overrides.get("intermediate_size"):
        config["intermediate_size"] = 4 * config["hidden_size"]
    return config


def parameter_count(config: dict) -> int:
    """Trainable parameters of the encoder with MLM and NSP heads (tied decoder)."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    layers = config["num_hidden_layers"]
    embeddings = (v + config["max_position_embeddings"] + config["type_vocab_size"]) * h + 2 * h
    per_layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    pooler = h * h + h
    heads = (h * h + h) + 2 * h + v + (2 * h + 2)
    return embeddings + layers * per_layer + pooler + heads
