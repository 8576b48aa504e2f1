"""The model code of a trust_remote_code export, generated from this repository's own modules.

Hugging Face loads remote code as one flat package: starting from the file it loads, it copies the files
named by `from .name import` lines into its module cache and imports them as submodules. So the export
copies every repository module the model needs (the import closure of model.py), flattened to one
directory (attention_kernels/grape_ap.py -> attention_kernels_grape_ap.py, attention_kernels/__init__.py -> attention_kernels.py), and rewrites
only their imports of each other into relative ones (a module imported as `from . import name` is also
named in a block of configuration_grape.py that never runs, for the copy). Two more rewrites, both
semantically neutral:

* top-level `import triton` lines go inside `try:`: transformers refuses a remote module that imports
  a package which is not installed, scanning every statement outside `try` blocks, while these
  modules are imported only after Triton was found (the portable path runs without it);
* the custom operators' namespace `grape::` becomes one derived from the copied sources and from the
  package the copy is imported as, so every copy loaded in a process (this repository's modules, an
  export, its save_pretrained copy, an export of another version) registers its own operators instead
  of replacing another's.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = os.path.join(REPO, "hf", "templates")
ROOT_MODULE = "model"
OPTIONAL_PACKAGES = ("triton",)  # imported only where present: hidden from transformers' import check
# transformers' own scan for the relative imports it copies (dynamic_module_utils.get_relative_imports)
HF_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\S+)\s+import", flags=re.MULTILINE)


def module_file(name: str) -> str | None:
    """The file of repository module `name` (dotted), or None when it is not one of ours."""
    base = os.path.join(REPO, *name.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def flat_name(name: str) -> str:
    return name.replace(".", "_")


def _imports(tree: ast.AST):
    """Every import statement, at any depth (function-level imports included), with the repository
    modules it names: (node, [(module, imported name or None)])."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node, [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, [(node.module, alias.name) for alias in node.names]


def closure(root: str = ROOT_MODULE) -> dict[str, str]:
    """{module name: source text} for `root` and every repository module it imports, directly or not."""
    sources, todo = {}, [root]
    while todo:
        name = todo.pop()
        if name in sources:
            continue
        with open(module_file(name)) as f:
            sources[name] = f.read()
        for _, names in _imports(ast.parse(sources[name])):
            for module, attribute in names:
                if attribute is not None and module_file(f"{module}.{attribute}"):
                    todo.append(f"{module}.{attribute}")  # `from package import submodule`
                elif module_file(module):
                    todo.append(module)
    return sources


def _relative_import(node, modules: set[str]) -> list[str] | None:
    """The relative form (statements) of an import that names repository modules; None for other imports."""
    if isinstance(node, ast.Import):
        ours = [alias for alias in node.names if alias.name in modules]
        if not ours:
            return None
        if len(ours) != len(node.names) or any("." in alias.name for alias in ours):
            raise ValueError(f"cannot export `{ast.unparse(node)}`: write `from package import module` instead")
        return [f"from . import {flat_name(a.name)}" + (f" as {a.asname}" if a.asname else "") for a in ours]
    if node.module not in modules:
        return None
    submodules = [a for a in node.names if f"{node.module}.{a.name}" in modules]
    if submodules and len(submodules) != len(node.names):
        raise ValueError(f"cannot export `{ast.unparse(node)}`: import submodules and names in separate lines")
    if submodules:
        return [f"from . import {flat_name(node.module + '.' + a.name)} as {a.asname or a.name}" for a in submodules]
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
    return [f"from .{flat_name(node.module)} import {names}"]


def rewrite(source: str, modules: set[str], namespace: str) -> str:
    """One module's source with its repository imports made relative, optional packages' top-level
    imports wrapped in try, and its custom operators moved to `namespace`."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits = []  # (first line, last line, replacement lines), 0-based inclusive
    for node, _ in _imports(tree):
        indent = " " * node.col_offset
        relative = _relative_import(node, modules)
        if relative is not None:
            edits.append((node.lineno - 1, node.end_lineno - 1, [indent + line + "\n" for line in relative]))
        elif node in tree.body and isinstance(node, ast.Import) and \
                all(a.name.split(".")[0] in OPTIONAL_PACKAGES for a in node.names):
            edits.append((node.lineno - 1, node.end_lineno - 1,
                          ["try:  # (so that transformers does not require it: this module is imported only when it is found)\n",
                           "    " + ast.unparse(node) + "\n", "except ImportError:\n", "    raise\n"]))
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first:last + 1] = replacement
    text = "".join(lines)
    # Each imported copy gets its own operators: the namespace ends with the package transformers imports the copy
    # as. Registering a name again replaces the operator of the copy that had it, whose models (an export loaded
    # before its save_pretrained copy, a model cached by an earlier from_pretrained) would then call into a destroyed
    # registration: that once failed with std::bad_alloc.
    per_copy = f'"{namespace}_" + "".join(c if c.isalnum() else "_" for c in __package__ or "") + "::'
    return re.sub(r'(custom_op\(\s*)"\w+::', lambda match: match.group(1) + per_copy, text)


def generate(out_dir: str) -> list[str]:
    """Write the model code (templates and the flattened closure of model.py) into out_dir; returns the
    file names. Raises ValueError when the result would not load as remote code (a bug of this exporter)."""
    sources = closure()
    modules = set(sources)
    flat = {flat_name(name): text for name, text in sources.items()}
    templates = {}
    for name in sorted(os.listdir(TEMPLATES)):
        if name.endswith(".py"):
            with open(os.path.join(TEMPLATES, name)) as f:
                templates[name.removesuffix(".py")] = f.read()
    if len(flat) != len(modules) or set(flat) & set(templates):
        raise ValueError(f"module names collide when flattened: {sorted(modules)} and templates {sorted(templates)}")
    digest = hashlib.sha256("".join(sources[name] for name in sorted(sources)).encode()).hexdigest()
    namespace = f"grape_{digest[:12]}"
    files = {name: rewrite(text, modules, namespace) for name, text in flat.items()}
    files.update(templates)
    # transformers copies the files named in `from .name import` lines, starting from the file it loads first
    # (configuration_grape.py); modules imported as `from . import name` are named in a block that never runs.
    hidden = sorted({m for text in files.values() for m in re.findall(r"^\s*from \. import (\w+)", text, re.M)})
    if hidden:
        files["configuration_grape"] += (
            "\n\n# Written by the export: transformers copies only the modules named in `from .name import` lines,\n"
            "# and these are imported as `from . import name`.\nif False:\n"
            + "".join(f"    from .{m} import __name__  # noqa: F401\n" for m in hidden))
    reachable, todo = set(), ["configuration_grape"]
    while todo:
        name = todo.pop()
        if name not in reachable:
            reachable.add(name)
            todo += [m for m in HF_RELATIVE_IMPORT.findall(files[name]) if m in files]
    missing = set(files) - reachable - {"modeling_grape"}
    if missing:
        raise ValueError(f"transformers would not copy {sorted(missing)} with the model code (a bug of the export)")
    for name, text in files.items():
        with open(os.path.join(out_dir, name + ".py"), "w") as f:
            f.write(text)
    return sorted(name + ".py" for name in files)
