"""SsdDir: the SSD tier's files, one per block, written atomically.

A block is written to a temporary file in the same directory, flushed, fsynced and then
renamed over its final name, so a reader (or a restart) never sees a partial block. The
shard starts empty, so leftovers of an earlier run (finished blocks and the temporary
files of a crash) are removed when the directory is opened.
"""

import logging
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

BLOCK_SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"


class SsdDir:
    """The directory holding one shard's SSD-tier blocks."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.num_leftovers_removed = self._remove_leftovers()

    def _remove_leftovers(self) -> int:
        removed = 0
        for path in self.root.iterdir():
            if path.suffix in (BLOCK_SUFFIX, TEMP_SUFFIX) and path.is_file():
                path.unlink(missing_ok=True)
                removed += 1
        if removed:
            logger.info("removed %d leftover block file(s) from %s", removed, self.root)
        return removed

    def path_for(self, key: int, generation: int) -> Path:
        # The generation keeps a re-demoted block from sharing a name with a stale write.
        return self.root / f"{key & 0xFFFF_FFFF_FFFF_FFFF:016x}-{generation}{BLOCK_SUFFIX}"

    def write(self, path: Path, data: bytes) -> None:
        """Write `data` to `path` atomically; raises OSError (disk full, I/O error...)."""
        fd, temp_name = tempfile.mkstemp(dir=self.root, prefix=path.stem, suffix=TEMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temp_name, path)
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise
        # No fsync of the directory: the tier is a cache emptied on every start, so only
        # atomicity matters, not that the rename survives a power cut.

    def open(self, path: Path) -> BinaryIO:
        """Open a block for reading; the open file stays readable if the block is removed."""
        return path.open("rb")

    @staticmethod
    def remove(path: Path) -> None:
        path.unlink(missing_ok=True)
