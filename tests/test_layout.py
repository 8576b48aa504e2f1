"""The import structure: no cycles between the project's modules, and no module imports one above it.

Layers, bottom to top: the model and its parts, configs, checkpoints and data (0); the pieces of training, the
evaluation and the Hugging Face export (1); the entry points train.py and sample.py (2); scripts/ (3). Imports
inside functions count too: they are how a cycle hides.
"""
import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = ("tests", ".git", "data_cache", "runs", "templates", "mutants")  # hf/templates are copied into exports, not
# imported; mutants/ is the generated copy scripts/mutants.py leaves (ignored by git)


def project_modules() -> dict[str, str]:
    modules = {}
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith((".", "__"))]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                modules[module.removesuffix(".__init__")] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:  # `from package import submodule` imports the submodule
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in modules else node.module)
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def layer(module: str) -> int:
    top = module.split(".")[0]
    if top in ("training", "eval", "hf"):
        return 1
    if top in ("train", "sample"):
        return 2
    if top == "scripts":
        return 3
    return 0


def test_no_module_imports_one_above_it():
    wrong = [(module, target) for module, targets in import_graph().items() for target in targets
             if layer(target) > layer(module)]
    assert wrong == []
    assert "data.loader" in import_graph()["training.step"]  # imported inside evaluate(): function-level imports count


def test_no_import_cycles():
    graph = import_graph()
    state, cycles = {}, []

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []
    # the two cycles this layout once had are gone
    assert "data.prepare" not in graph["data.loader"] and "data.loader" not in graph["data.prepare"]
    assert "kernels.grape_ap" not in graph["kernels.grape_ap_triton"]
