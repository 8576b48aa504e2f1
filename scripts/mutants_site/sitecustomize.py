"""Only on PYTHONPATH during scripts/mutants.py's stats run: a subprocess of a test (train.py, torchrun's workers, a
`python -c` job) records which mutated functions it called, so that mutmut runs that test for their mutants too.
mutmut itself records calls only in the test process."""
import os

if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("GRAPE_MUTMUT_HITS"):
    import atexit
    import json

    try:
        from mutmut.mutation import trampoline
    except ImportError:  # not a mutmut run after all
        trampoline = None
    if trampoline is not None:
        called = set()

        def record(name, caller=None):
            called.add(name)
        trampoline.record_trampoline_hit = record

        def save():
            if called:
                path = os.path.join(os.environ["GRAPE_MUTMUT_HITS"], f"{os.getpid()}.json")
                with open(path, "w") as f:
                    json.dump({"test": os.environ.get("GRAPE_MUTMUT_TEST", ""), "functions": sorted(called)}, f)
        atexit.register(save)
