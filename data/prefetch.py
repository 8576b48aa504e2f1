"""Training batches read ahead in a background thread, each checked for token ids the model cannot embed."""
from concurrent.futures import ThreadPoolExecutor

from data.shards import DataError


class DamagedBatch(DataError):
    """A batch with a token id >= vocab_size. Raised on the process that read it (the others never see it), so
    train.py reports it from whichever process that is."""


def check_batch(x, y, vocab_size, index, data_dir=None):
    """Raise DamagedBatch if batch `index` holds a token id >= vocab_size: an embedding lookup would fail on the
    GPU (or read past the table on the CPU), and the shard it came from has changed since it was verified."""
    largest = max(int(x.max()), int(y.max())) if x.numel() else -1
    if largest >= vocab_size:
        where = f" of {data_dir}" if data_dir else ""
        verify = f"python -m data.prepare --verify {data_dir}" if data_dir else "python -m data.prepare --verify DIR"
        raise DamagedBatch(f"training batch {index} holds token id {largest}, but vocab_size is {vocab_size}: a shard"
                           f"{where} changed after it was checked, and nothing of this batch was trained on; run "
                           f"`{verify}` to find the shard and the command that rewrites it")


class PrefetchedBatches:
    """source.batch(index) for any source with that method, read ahead in one background thread.

    After batch(i), the batches i + stride, ..., i + depth·stride are prepared in the background: with
    stride = the number of processes these are this process's next micro-batches in train.py's numbering. Any
    other index is read at once, so the batches are exactly source.batch(index) in any order, and resuming needs
    nothing but the step, as without prefetching. Given vocab_size, every batch is checked with check_batch in the
    background thread (free for the training step); pin_memory pins batches for asynchronous copies to a GPU."""

    def __init__(self, source, stride=1, depth=4, vocab_size=None, pin_memory=False):
        if stride < 1 or depth < 0:
            raise ValueError(f"stride must be >= 1 and depth >= 0 (got {stride}, {depth})")
        self.source, self.stride, self.depth = source, stride, depth
        self.vocab_size, self.pin_memory = vocab_size, pin_memory
        self.data_dir = getattr(source, "data_dir", None)
        self._pending = {}  # index -> Future of (x, y)
        self.late = 0  # batches asked for before they were ready: how often a step waited on data
        # The thread ends when this object is garbage-collected (ThreadPoolExecutor's own weakref), so callers
        # need not close anything.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch")

    def _read(self, index):
        x, y = self.source.batch(index)
        if self.vocab_size is not None:
            check_batch(x, y, self.vocab_size, index, self.data_dir)
        if self.pin_memory:
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    def batch(self, index):
        future = self._pending.pop(index, None)
        ahead = [index + k * self.stride for k in range(1, self.depth + 1)]
        for stale in [i for i in self._pending if i not in ahead]:  # a jump (e.g. evaluation order changed)
            self._pending.pop(stale).cancel()
        for i in ahead:
            if i not in self._pending:
                self._pending[i] = self._reader.submit(self._read, i)
        if future is None or not future.done():
            self.late += 1
        return future.result() if future is not None else self._read(index)

    def __getattr__(self, name):  # windows_per_epoch, epoch_of, ... of the source
        return getattr(self.source, name)
