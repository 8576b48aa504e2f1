"""The command that plots runs' loss curves; its code is studies/curves.py (a study's report draws with it too).

    python scripts/plot_runs.py runs/medium/rope runs/medium/fox runs/medium/grape_ap --out docs/medium_loss.png
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from studies.curves import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
