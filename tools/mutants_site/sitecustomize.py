"""Only on PYTHONPATH during tools/mutants.py's stats run: a subprocess of a test (train.py, torchrun's workers, a
`python -c` job) records which mutated functions it called, so that mutmut runs that test for their mutants too
(mutmut itself records calls only in the test process); and code that torch.compile traces calls the original
functions without recording (the recording is Python that dynamo cannot trace, so fullgraph would fail)."""
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

        try:
            import torch
            real = trampoline.get_mutant_under_test

            def outside_compiled_code():
                name = real()
                return "" if name == "stats" and torch.compiler.is_compiling() else name
            trampoline.get_mutant_under_test = outside_compiled_code
        except ImportError:
            pass

        def save():
            if called:
                folder = os.environ["GRAPE_MUTMUT_HITS"]
                test = os.environ.get("GRAPE_MUTMUT_TEST", "")
                if not test and os.path.exists(os.path.join(folder, "current_test")):
                    with open(os.path.join(folder, "current_test")) as f:  # the test running now (one at a time)
                        test = f.read().strip()
                with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
                    json.dump({"test": test, "functions": sorted(called)}, f)
        atexit.register(save)
