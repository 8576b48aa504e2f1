"""A prepared data folder, opened once: its manifest read, its shards listed and verified once, its identity.

train.py and the evaluation commands open the folder once as a PreparedData and hand that object down (to the
batch sources of data/loader.py and to the shard checks of data/verify.py, which checks it once), so no layer
below re-opens the folder by path. Its identity is the sha256 of its manifest.json, which lists every shard's
sha256: a folder prepared again at the same path (other data, or the same data with other arguments) has another
identity, which a checkpoint records, so that a resume or an evaluation on other data than the run's is said,
not silently done.
"""
import os

from data.manifest import (GPT2_VOCAB_SIZE, journals, read_manifest_and_identity, repair_hint, require_folder,
                           shard_paths)
from data.shards import open_shard


class PreparedData:
    """The prepared folder at `path`. manifest: its manifest.json as a dict, or None for an llm.c-style folder of
    GPT-2 shards without one; identity: the manifest's sha256 (None without one); tokenizer and vocab_size: of its
    shards (vocab_size None if unknown)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        require_folder(self.path)
        has_manifest = os.path.exists(os.path.join(self.path, "manifest.json")) or journals(self.path)
        if has_manifest:
            self.manifest, self.identity = read_manifest_and_identity(self.path)
        else:  # an llm.c-style folder (which holds GPT-2 token shards), or no data at all: shard_paths says so
            shard_paths(self.path, None, "train")
            self.manifest, self.identity = None, None
        manifest = self.manifest or {}
        self.tokenizer = manifest.get("tokenizer", "gpt2")
        self.vocab_size = (manifest.get("vocab_size") or manifest.get("n_vocab")) if self.manifest else GPT2_VOCAB_SIZE
        self._paths, self._shards, self._verified = {}, {}, {}  # _verified: split -> the vocab sizes checked

    def __repr__(self):
        return f"PreparedData({self.path!r})"

    def split_paths(self, split):
        """The shard files of a split ("train" or "val"), in order."""
        if split not in self._paths:
            self._paths[split] = shard_paths(self.path, self.manifest, split)
        return self._paths[split]

    def expected_sha256(self):
        """{shard path: the sha256 its manifest records} ({} without a manifest)."""
        if self.manifest is None:
            return {}
        return {os.path.join(self.path, s["file"]): s.get("sha256") for s in self.manifest["shards"]}

    def verified(self, split, vocab_size=None):
        """Whether data.verify.verify_shards has checked this split through this object (against vocab_size, or
        against any vocabulary size when None): a folder is checked once however many readers it has."""
        done = self._verified.get(split, set())
        return vocab_size in done or (vocab_size is None and bool(done))

    def mark_verified(self, splits, vocab_size=None):
        for split in splits:
            self._verified.setdefault(split, set()).add(vocab_size)

    def shards(self, split):
        """The shards of a split, memory-mapped once (verify them first: data.verify.verify_shards)."""
        if split not in self._shards:
            self._shards[split] = [open_shard(p) for p in self.split_paths(split)]
        return self._shards[split]

    def repair_hint(self):
        """What to run when one of its shards is damaged or missing (data.manifest.repair_hint)."""
        if self.manifest is None:
            return repair_hint(self.path)  # (reads nothing: the folder has no manifest)
        return repair_hint(self.path, self.manifest)


def open_data(data):
    """A PreparedData for a folder path; a PreparedData as it is."""
    return data if isinstance(data, PreparedData) else PreparedData(data)


def other_data_problem(saved_identity, data):
    """The sentence's middle for a folder whose identity differs from the one a checkpoint recorded, or None when
    they agree or either is unknown (a checkpoint from before identities were recorded, a manifest-free folder)."""
    if not saved_identity or not data.identity or saved_identity == data.identity:
        return None
    return (f"{data.path} now holds other data (manifest sha256 {data.identity[:12]}...) than the run was trained on "
            f"(manifest sha256 {saved_identity[:12]}... in the checkpoint): it was prepared again since")
