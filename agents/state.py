"""Each GPU's original limit, saved to disk before flexgate first changes it.

One JSON file in the state directory, written atomically (a temporary file, fsync, rename), so a
crash leaves either the old file or the new one. A restarted agent restores what it finds
before it serves anything.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

FILE_NAME = "original-limits.json"


class OriginalLimits:
    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / FILE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._saved: dict[str, dict[str, float | int]] = self._read()

    def _read(self) -> dict[str, dict[str, float | int]]:
        if not self.path.exists():
            return {}
        doc = json.loads(self.path.read_text(encoding="utf-8"))
        return {str(k): v for k, v in doc.get("gpus", {}).items()}

    def _write(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".limits-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"gpus": self._saved}, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def remember(self, uuid: str, index: int, limit_w: float) -> None:
        """Save a GPU's original limit, unless one is saved already (the first one counts)."""
        self.remember_all([(uuid, index, limit_w)])

    def remember_all(self, limits: list[tuple[str, int, float]]) -> None:
        """Save these GPUs' original limits (uuid, index, limit [W]) in one write, those not
        saved already: one fsync for a command's GPUs, not one each."""
        with self._lock:
            new = {u: {"index": i, "original_w": w} for u, i, w in limits if u not in self._saved}
            if not new:
                return
            self._saved.update(new)
            self._write()

    def original_w(self, uuid: str) -> float | None:
        entry = self._saved.get(uuid)
        return None if entry is None else float(entry["original_w"])

    def saved(self) -> dict[str, tuple[int, float]]:
        """uuid -> (index, original limit [W])."""
        return {u: (int(e["index"]), float(e["original_w"])) for u, e in self._saved.items()}

    def forget_all(self, uuids: list[str]) -> None:
        """Drop these GPUs once their original limits are back, in one write."""
        with self._lock:
            dropped = [u for u in uuids if self._saved.pop(u, None) is not None]
            if dropped:
                self._write()
