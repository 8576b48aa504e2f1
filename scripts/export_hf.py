"""Export a trained checkpoint as a Hugging Face model directory.

    python scripts/export_hf.py runs/medium/rope exports/medium-rope         # native Qwen3ForCausalLM
    python scripts/export_hf.py runs/medium/fox exports/medium-fox           # remote code (trust_remote_code=True)
    python scripts/export_hf.py RUN_DIR OUT_DIR --format remote         # remote code even for a rope model

RUN_DIR is a run directory holding ckpt.pt (or the .pt file itself); OUT_DIR must not exist yet (missing parent
directories are made). See docs/hf_export.md for what loads natively, the parity the tests measure, and the way
back (train.py's init_from).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from hf.export import FORMATS, ExportError, export  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory holding ckpt.pt, or a checkpoint file")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="the new directory to write (must not exist; missing "
                                                           "parent directories are made)")
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="native: Qwen3ForCausalLM (rope models only); remote: the model code beside the "
                             "weights (any encoding); auto: native when possible (default)")
    args = parser.parse_args(argv)
    try:
        summary = export(args.run_dir, args.out_dir, args.format)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    trust = "" if summary["format"] == "native Qwen3" else ", trust_remote_code=True"
    print(f"wrote {os.path.abspath(args.out_dir)}: pos={summary['pos']}, kv_shift={summary['kv_shift']} as "
          f"{summary['format']}; load it with AutoModelForCausalLM.from_pretrained({args.out_dir!r}{trust})")


if __name__ == "__main__":
    main()
