"""The product's import graph: no cycles, and no import against the layers of DESIGN.md.

Builds the graph of the installed package's modules: lite.* from lite/, and lite.kernels.*,
lite.models.*, lite.cli.* from kernels/, models/, cli/ (setup.py's package_dir). Every Import and
ImportFrom anywhere in a file counts, at module level or inside a function: a function-level import
hides a cycle from the interpreter, not from the design. `from P import N` is an edge to P.N where
that is a module, else to P; the package __init__ that Python also runs on the way is not counted
(every module would then depend on lite/__init__.py). Tests, tools and the lab are not product."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The layers, as data (DESIGN.md, "Layers"). Each rule: what it says, the modules it applies to
# (prefixes: a module matches a prefix when it is that module or inside it), and either `only`
# (all they may import from the product) or `not` (what they may not import). A rule whose modules
# do not exist yet checks nothing.
LEAVES = ("lite.errors",)          # what kernels/ may import from lite's own modules
PURE = LEAVES + ("lite.gguf_file", "lite.config", "lite.tokenizer", "lite.pretokenizer", "lite.chat_template",
                 "lite.sampling", "lite.chunking", "lite.cost_profile", "lite.cost_fit",
                 "lite.cost_tables", "lite.timeline", "lite.hub", "lite.progress")
LAYERS = [
    ("kernels/ imports only kernels and the leaves (lite.errors)",
     ("lite.kernels",), {"only": ("lite.kernels",) + LEAVES}),
    ("models/ imports no backend, no kernels and nothing above it (engine, stage chain, bench, api, cli)",
     ("lite.models",), {"not": ("lite.backends", "lite.kernels", "lite.engine", "lite.pipeline",
                                "lite.stage", "lite.bench", "lite.calibrate", "lite.api", "lite.cli")}),
    ("lite/backends/ imports nothing above the ops (models, stage chain, engine, bench, api, cli)",
     ("lite.backends",), {"not": ("lite.models", "lite.engine", "lite.pipeline", "lite.stage",
                                  "lite.bench", "lite.calibrate", "lite.api", "lite.cli")}),
    ("the leaves (gguf file, config, tokenizer, sampling, chunking, timeline: pure, no device) import only leaves",
     PURE, {"only": PURE}),
    ("nothing below cli/ imports lite.cli",
     ("lite",), {"not": ("lite.cli",), "except": ("lite.cli",)}),
]


def package_dirs():
    """{package: directory} from setup.py's packages and package_dir, read from its source (not run):
    a package without its own entry lies under its parent's directory (lite.backends: lite/backends)."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    kw = {node.arg: ast.literal_eval(node.value) for node in ast.walk(tree)
          if isinstance(node, ast.keyword) and node.arg in ("packages", "package_dir")}
    mapping = kw.get("package_dir", {})
    dirs = {}
    for package in kw["packages"]:
        parts = package.split(".")
        for cut in range(len(parts), -1, -1):
            head = ".".join(parts[:cut])
            if head in mapping or cut == 0:
                base = mapping.get(head, "")
                dirs[package] = "/".join(filter(None, [base] + parts[cut:]))
                break
    return dirs


def modules():
    """{module name: path} of every product module."""
    found = {}
    for package, folder in package_dirs().items():
        for path in (ROOT / folder).glob("*.py"):
            name = package if path.name == "__init__.py" else f"{package}.{path.stem}"
            found[name] = path
    return found


def _package_of(name, path):
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports(name, path, known):
    """[(target module, line)] for every import of a product module in this file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in known:          # `import lite.kernels.x.y` -> deepest module
                    target = target.rpartition(".")[0]
                if target:
                    out.append((target, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = _package_of(name, path).split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.append((sub, node.lineno))
                elif base in known:
                    out.append((base, node.lineno))
    return [(t, line) for t, line in out if t != name]


def graph():
    """{module: {target: first line}}, and each module's path relative to the repository."""
    known = modules()
    edges = {}
    for name, path in sorted(known.items()):
        edges[name] = {}
        for target, line in imports(name, path, known):
            edges[name].setdefault(target, line)
    rel = {n: p.relative_to(ROOT).as_posix() for n, p in known.items()}
    return edges, rel


def cycles(edges):
    """One cycle (a list of modules, first = last) for each strongly connected set of modules."""
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def visit(v):                                   # Tarjan; the graph is small (under 200 nodes)
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    found = []
    for comp in sccs:                               # a shortest way from the first module back to it
        members, start = set(comp), comp[0]
        parent, frontier, back = {start: None}, [start], None
        while back is None:
            nxt = []
            for v in frontier:
                for w in sorted(edges[v]):
                    if w == start and back is None:
                        back = v
                    elif w in members and w not in parent:
                        parent[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [back]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
        found.append(path[::-1] + [start])
    return found


def _matches(module, prefixes):
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(edges):
    """[(rule, source, target, line)] for every import against LAYERS."""
    out = []
    for rule, applies, spec in LAYERS:
        for src in sorted(edges):
            if not _matches(src, applies) or _matches(src, spec.get("except", ())):
                continue
            for dst, line in sorted(edges[src].items()):
                bad = (not _matches(dst, spec["only"])) if "only" in spec else _matches(dst, spec["not"])
                if bad:
                    out.append((rule, src, dst, line))
    return out


def test_the_graph_reads_package_dir_relative_and_function_level_imports(tmp_path):
    edges, rel = graph()
    assert rel["lite.kernels"] == "kernels/__init__.py" and rel["lite.cli.main"] == "cli/main.py"
    assert rel["lite.backends.cpu"] == "lite/backends/cpu.py" and "lite.models" in edges
    src = tmp_path / "m.py"
    src.write_text("import lite.b.c\nfrom . import a\nfrom .b import c as d, nothing\n"
                   "def f():\n    from lite import b\n    import lite.b.missing\n")
    known = {"lite", "lite.a", "lite.b", "lite.b.c", "lite.m"}
    assert imports("lite.m", src, known) == [("lite.b.c", 1), ("lite.a", 2), ("lite.b.c", 3), ("lite.b", 3),
                                             ("lite.b", 5), ("lite.b", 6)]
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}}) == [["a", "b", "c", "a"]]
    assert violations({"lite.kernels.x": {"lite.errors": 1, "lite.engine": 2}}) == [
        (LAYERS[0][0], "lite.kernels.x", "lite.engine", 2)]


def test_no_import_cycles():
    edges, rel = graph()
    found = cycles(edges)
    lines = []
    for cyc in found:
        hops = [f"{rel[a]}:{edges[a][b]} -> {rel[b]}" for a, b in zip(cyc, cyc[1:])]
        lines.append(" ; ".join(hops))
    assert not found, f"{len(found)} import cycle(s), one path each:\n" + "\n".join(lines)


def test_imports_follow_the_layers():
    edges, rel = graph()
    bad = violations(edges)
    lines = [f"{rel[s]}:{line} imports {d} ({rel[d]}): against '{rule}'" for rule, s, d, line in bad]
    assert not bad, f"{len(bad)} import(s) against DESIGN.md's layers:\n" + "\n".join(lines)




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
    found = [f"{p.parent.name}/{hit}" for folder in ("lite", "kernels", "models", "cli")
             for p in sorted((ROOT / folder).rglob("*.py")) for hit in _shadowing_imports(p)]
    assert not found, "\n".join(found)
