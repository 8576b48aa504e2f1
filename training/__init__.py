"""The pieces of the training loop in train.py, one concern per module (docs/train.md has the map).

    distributed.py    rank, world size, device; the collectives training needs
    optimizer.py      AdamW parameter groups and the learning-rate schedule
    stopping.py       SIGTERM / Ctrl-C as one object, and the stop vote of all processes
    checkpointing.py  what a checkpoint holds, resume checks, saving and restoring
    metrics.py        console, metrics.jsonl and wandb records; throughput and memory
    step.py           one optimizer step's forward and backward passes, and validation

None of them imports train.py or another module above it.
"""
