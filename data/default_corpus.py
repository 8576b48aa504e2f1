"""Build data/default_corpus.jsonl.xz, the embedded English corpus, from the running Python's own documentation.

    python -m data.default_corpus          # rewrites data/default_corpus.jsonl.xz

Documents, one JSON line each, in a fixed random order ({"text": ..., "source": ...}):
  - every topic of the Python Language Reference that pydoc shows (pydoc_data.topics), one document per topic;
  - for every module of the standard library, its docstrings (module, classes, functions) in source order.
The text is Python Software Foundation documentation (PSF license). The committed file was built with
CPython 3.11.7; building with another version gives a slightly different corpus, so the file is committed
and the quickstart never rebuilds it.
"""
import ast
import json
import lzma
import os
import random
import sys
import sysconfig

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "default_corpus.jsonl.xz")


def language_reference_topics():
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield {"text": topics[name].strip(), "source": f"pydoc_data.topics:{name}"}


def stdlib_docstrings():
    stdlib = sysconfig.get_paths()["stdlib"]
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            try:
                with open(path, encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue  # a few test files are deliberately invalid
            nodes = [n for n in ast.walk(tree)
                     if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
            nodes.sort(key=lambda n: getattr(n, "lineno", 0))
            docstrings = [d for d in (ast.get_docstring(n) for n in nodes) if d]
            if docstrings:
                yield {"text": "\n\n".join(docstrings), "source": os.path.relpath(path, stdlib).replace(os.sep, "/")}


def build(output=OUTPUT):
    documents = [*language_reference_topics(), *stdlib_docstrings()]
    # A fixed shuffle, so that the validation split (the first tokens) is a sample of the whole corpus.
    random.Random(0).shuffle(documents)
    lines = [json.dumps(doc, ensure_ascii=False) + "\n" for doc in documents]
    payload = lzma.compress("".join(lines).encode("utf-8"), preset=9 | lzma.PRESET_EXTREME)
    tmp = output + ".part"
    with open(tmp, "wb") as f:
        f.write(payload)
    os.replace(tmp, output)
    chars = sum(len(json.loads(line)["text"]) for line in lines)
    print(f"{output}: {len(lines)} documents, {chars:,} characters, {len(payload):,} bytes compressed")


if __name__ == "__main__":
    build()
