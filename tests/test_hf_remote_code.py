"""hf/remote_code.py: the remote code's optional imports."""
import ast


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_optional_packages_are_imported_in_try_blocks_that_re_raise():
    from hf.remote_code import rewrite
    source = "import os\nimport triton\nimport triton.language as tl\n\n\ndef f():\n    import triton\n"
    tree = ast.parse(rewrite(source, set(), "ns"))
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import)]
    assert [ast.unparse(node) for node in imports] == ["import os", "import triton", "import triton.language as tl",
                                                       "import triton"]
    wrapped = [node for node in tree.body if isinstance(node, ast.Try)]
    assert [ast.unparse(node.body[0]) for node in wrapped] == ["import triton", "import triton.language as tl"]
    for node in wrapped:
        (handler,) = node.handlers
        assert ast.unparse(handler.type) == "ImportError" and [type(s) for s in handler.body] == [ast.Raise]
        assert handler.body[0].exc is None  # the ImportError itself, re-raised
    assert isinstance(tree.body[0], ast.Import) and isinstance(tree.body[-1], ast.FunctionDef)
