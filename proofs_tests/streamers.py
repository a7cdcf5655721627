"""A streamer that records what ``generate`` pushes, shared by the ``generate`` tests."""

from __future__ import annotations

import torch


class RecordingStreamer:
    """transformers' streamer interface (``put``, ``end``), recording each push."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended += 1
