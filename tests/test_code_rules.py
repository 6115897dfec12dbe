"""Rules of the code, read from the sources: each fails naming every place against it, and each
checks first that it sees the pattern on a small example.

Shadowing imports: no function imports a name its module imports at the top (the name becomes local
to the whole function: a use above that import raises UnboundLocalError). The CUDA backend's parts
call each other only through public names. Models, the stage and the chain never ask an ops object
what it has (lite/backends/ops.py `Ops` declares every op and capability). Names say what things are:
the old abbreviations do not come back.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("lite", "kernels", "models", "cli")


# ---- shadowing imports ----------------------------------------------------------------------------

def _shadowing_imports(path):
    """Function-level imports of a name the module imports at its top: Python makes the name local
    to the whole function, so a use above that import raises UnboundLocalError, on the paths that
    reach it only (gpu_layout.dequantize_matrix did so on every GPU prefill)."""
    tree = ast.parse(path.read_text())
    top = {(a.asname or a.name).split(".")[0] for n in tree.body
           if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    found = []
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(f):
                if isinstance(n, (ast.Import, ast.ImportFrom)):
                    found += [f"{path.name}:{n.lineno}: {a.asname or a.name}"
                              for a in n.names if (a.asname or a.name).split(".")[0] in top]
    return found


def test_no_function_import_shadows_a_module_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from a import b\n\ndef f():\n    if b.X:\n        from a import b\n")
    assert _shadowing_imports(bad) == ["bad.py:5: b"]          # the check sees the pattern
    found = [f"{p.parent.name}/{hit}" for folder in SOURCES
             for p in sorted((ROOT / folder).rglob("*.py")) for hit in _shadowing_imports(p)]
    assert not found, "\n".join(found)


# ---- the CUDA backend's parts ---------------------------------------------------------------------

def _foreign_private_uses(path):
    """`self._name` uses in one part of the CUDA backend (a mixin file) whose name the file neither
    defines nor assigns: a call into another part's private method, an interface nobody can see."""
    tree = ast.parse(path.read_text())
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    own |= {t.attr for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            for tgt in (n.targets if isinstance(n, ast.Assign) else [n.target])
            for t in ast.walk(tgt) if isinstance(t, ast.Attribute)}
    return sorted({f"{path.name}: self.{n.attr}" for n in ast.walk(tree)
                   if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                   and n.attr.startswith("_") and not n.attr.startswith("__") and n.attr not in own})


def test_cuda_backend_parts_use_only_each_others_public_methods(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("class A:\n    def f(self):\n        self._x = 1\n        return self._g() + self._x\n")
    assert _foreign_private_uses(bad) == ["bad.py: self._g"]     # the check sees the pattern
    found = [hit for p in sorted((ROOT / "lite" / "backends").glob("cuda*.py")) for hit in _foreign_private_uses(p)]
    assert not found, "\n".join(found)


# ---- the ops interface ----------------------------------------------------------------------------

def _ops_probes(path):
    """hasattr/getattr of an ops or backend object (`ops`, `self.ops`, `backend_cls`, ...): the
    caller asking what the backend has, where lite/backends/ops.py Ops says it with a default."""
    def probed(node):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
        return name in ("ops", "backend", "backend_cls")
    return [f"{path.name}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("hasattr", "getattr")
            and n.args and probed(n.args[0])]


def test_no_probes_of_the_ops_object(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("f = getattr(ops, 'x', None)\ng = hasattr(self.ops, 'y') and hasattr(backend_cls, 'z')\n")
    assert _ops_probes(bad) == ["bad.py:1", "bad.py:2", "bad.py:2"]     # the check sees the pattern
    files = [p for folder in SOURCES if folder != "kernels" for p in sorted((ROOT / folder).rglob("*.py"))
             if "backends" not in p.parts]
    found = [hit for p in files for hit in _ops_probes(p)]
    assert not found, "\n".join(found)


# ---- names ----------------------------------------------------------------------------------------

# The abbreviations names once had (mv_rows, mvq, lt_u4, LtDqb, dqb, TIQ3_XXS_INT8): a name says what it does.
OLD_NAMES = re.compile(r"\b(mv[a-z0-9_]*|lt_[a-z0-9_]+|Lt[A-Z]\w*|dqb\w*|TIQ3_XXS\w*)\b")
NAMED = ("lite", "kernels", "models", "cli", "tests", "tools", "docs")


def _old_names(path):
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [f"{path.name}:{i}: {m.group(0)}" for i, line in enumerate(lines, 1) for m in OLD_NAMES.finditer(line)]


def test_no_abbreviated_names_come_back(tmp_path):
    bad = tmp_path / "bad.cuh"
    bad.write_text("mv_rows_any<TIQ3_XXS_INT8<1, 2>>(x); // move, lit, TQ4_K\nLtDqb<O>::W; dqb<float>; lt_u4(v);\n")
    assert _old_names(bad) == ["bad.cuh:1: mv_rows_any", "bad.cuh:1: TIQ3_XXS_INT8", "bad.cuh:2: LtDqb",
                               "bad.cuh:2: dqb", "bad.cuh:2: lt_u4"]     # the check sees the pattern
    files = [p for folder in NAMED for p in sorted((ROOT / folder).rglob("*"))
             if p.suffix in (".py", ".cu", ".cuh", ".md") and p != Path(__file__).resolve()]
    found = [hit for p in files + sorted(ROOT.glob("*.md")) for hit in _old_names(p)]
    assert not found, "\n".join(found)
