"""Datasets and padding for Iconq+ training and batched inference."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from sloctl.datasets.interactions import QuerySample, pair_vectors

__all__ = ["IconqDataset", "collate_rows"]


def _pad(seqs: list[np.ndarray], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    out = torch.zeros(len(seqs), int(lengths.max()) if len(seqs) else 0, width)  # (B, T, D)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, : len(s)] = torch.from_numpy(np.asarray(s, dtype=np.float32))
    return out, lengths


def collate_rows(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Pad per-query items into a batch for :class:`~sloctl.models.iconq.IconqNet`."""
    width = items[0]["before"].shape[1]
    before_x, before_len = _pad([it["before"] for it in items], width)
    after_x, after_len = _pad([it["after"] for it in items], width)
    batch = {
        "self_x": torch.from_numpy(np.stack([it["self_x"] for it in items]).astype(np.float32)),
        "before_x": before_x, "before_len": before_len,
        "after_x": after_x, "after_len": after_len,
        "base_log": torch.tensor([float(it["base_log"]) for it in items], dtype=torch.float32),
    }
    if "label_log" in items[0]:
        batch["label_log"] = torch.tensor([it["label_log"] for it in items], dtype=torch.float32)
        batch["censored"] = torch.tensor([it["censored"] for it in items], dtype=torch.bool)
        batch["full"] = torch.tensor([it["full"] for it in items], dtype=torch.bool)
    return batch


class IconqDataset(Dataset):
    """Samples of one split, with interaction vectors built once.

    Args:
        samples: from :func:`~sloctl.datasets.interactions.build_samples`.
        own: per-row self vectors of the whole log (N, S).
        plan, stage_s, arrival_s, size: per-row arrays of the whole log.
        size_features: include the cluster-size features.
    """

    def __init__(self, samples: list[QuerySample], own: np.ndarray, plan: np.ndarray, stage_s: np.ndarray,
                 arrival_s: np.ndarray, size: np.ndarray, size_features: bool) -> None:
        self.items = []
        for s in samples:
            q_b = np.full(len(s.before), s.row)
            q_a = np.full(len(s.after), s.row)
            self.items.append({
                "self_x": own[s.row],
                "before": pair_vectors(plan, stage_s, arrival_s, size, q_b, s.before, size_features),
                "after": pair_vectors(plan, stage_s, arrival_s, size, q_a, s.after, size_features),
                "base_log": float(np.log(stage_s[s.row])),
                "label_log": s.label_log, "censored": s.censored, "full": s.full, "row": s.row,
            })

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]
