"""Whether the run that train.py would write for these arguments already has a checkpoint, for a requeued job of
scripts/slurm/train.sbatch, which then continues it with --resume (and otherwise starts it again):

    python scripts/slurm/has_checkpoint.py CONFIG [train.py arguments]

Exit status 0 (and the run directory on stdout) when it holds ckpt.pt or a sharded checkpoint that train.py can
resume, 1 when it holds neither, 2 with train.py's one-line error when the arguments are refused. The run directory
comes from train.py's own argument parsing and config resolution, so it is the one train.py writes.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import checkpoints  # noqa: E402
import train  # noqa: E402
from config import ConfigError, resolve  # noqa: E402
from model import GPTConfig  # noqa: E402


def saved_run_directory(argv: list[str]) -> str | None:
    """The run directory of train.py's arguments when it holds a checkpoint, else None."""
    args = train.parse_args(argv)
    _, cfg = resolve(args.config_path, args.overrides, GPTConfig, resume=args.resume)
    saved = os.path.isfile(os.path.join(cfg.out_dir, "ckpt.pt")) or checkpoints.shard_directories(cfg.out_dir)
    return cfg.out_dir if saved else None


def main() -> None:
    try:
        run_dir = saved_run_directory(sys.argv[1:])
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if run_dir is None:
        sys.exit(1)
    print(run_dir)


if __name__ == "__main__":
    main()
