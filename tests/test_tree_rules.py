"""Rules of the tree, read from the sources of the installed package (lite/, kernels/, models/, cli/).

Environment variables: every one the product reads is documented, and there are at most three of
lite's own. The scan sees os.environ.get(NAME), os.environ[NAME], os.getenv(NAME), environ.get(NAME),
NAME in os.environ, os.environ.setdefault / pop(NAME), and any string constant that is a whole
LITE_* name (a name kept in a constant and read later counts as read). It fails naming each LITE_*
variable the code reads that docs/configuration.md does not list, each that the page lists but the
code no longer reads, a read of the environment whose name is not a literal, and any other variable
not in ALLOWED below. Settings a benchmark compares belong in lite.backend_config.BackendConfig,
not in the environment (docs/configuration.md).

The import graph: no cycles, and no import against the layers of docs/design.md. Built from the
package's modules: lite.* from lite/, and lite.kernels.*, lite.models.*, lite.cli.* from kernels/,
models/, cli/ (setup.py's package_dir). Every Import and ImportFrom anywhere in a file counts, at
module level or inside a function: a function-level import hides a cycle from the interpreter, not
from the design. `from P import N` is an edge to P.N where that is a module, else to P; the package
__init__ that Python also runs on the way is not counted (every module would then depend on
lite/__init__.py). Tests, tools and the lab are not product.

The rules of the code itself (shadowing imports, the CUDA backend's parts, probes of the ops object,
abbreviated names) are in tests/test_code_rules.py.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("lite", "kernels", "models", "cli")


# ---- environment variables ------------------------------------------------------------------------

DOC = ROOT / "docs" / "configuration.md"
MAX_LITE_VARIABLES = 3
LITE_NAME = re.compile(r"LITE_[A-Z][A-Z0-9_]*")

# Variables that are not lite's own, each with the reason the product may read it.
ALLOWED = {
    "XDG_CACHE_HOME": "the cache root's default when LITE_CACHE is unset (the XDG base directory spec)",
    "NUMBA_ENABLE_CUDASIM": "Numba's own switch: under the CUDA simulator the kernels take their simulator paths",
}

# A variable read only in one file (the rest of the code gets it as an argument or a field).
ONLY_IN = {
    "LITE_REFERENCE_KERNELS": "lite/backend_config.py",
}

_GETTERS = {"get", "getenv", "setdefault", "pop", "getenvb"}


def _is_environ(node):
    """os.environ, environ, os.environb."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("environ", "environb")
    return isinstance(node, ast.Name) and node.id in ("environ", "environb")


def _literal(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def reads_in(tree):
    """(name or None, line) for every read of the environment in a module; None: not a literal."""
    found = []
    for node in ast.walk(tree):
        arg = None
        if isinstance(node, ast.Call):
            f = node.func
            env_method = isinstance(f, ast.Attribute) and f.attr in _GETTERS and _is_environ(f.value)
            getenv = ((isinstance(f, ast.Attribute) and f.attr in ("getenv", "getenvb")
                       and isinstance(f.value, ast.Name) and f.value.id == "os")
                      or (isinstance(f, ast.Name) and f.id in ("getenv", "getenvb")))
            if (env_method or getenv) and node.args:
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            arg = node.slice
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1
              and isinstance(node.ops[0], (ast.In, ast.NotIn)) and _is_environ(node.comparators[0])):
            arg = node.left
        if arg is not None:
            found.append((_literal(arg), node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and LITE_NAME.fullmatch(node.value):
            found.append((node.value, node.lineno))
    return sorted(set(found), key=lambda f: (f[1], f[0] or ""))   # a literal argument is also a constant


def scan():
    """{name: [(path, line), ...]} over the product's sources; None collects non-literal reads."""
    reads = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            for name, line in reads_in(tree):
                reads.setdefault(name, []).append((rel, line))
    return reads


def documented():
    return set(LITE_NAME.findall(DOC.read_text(encoding="utf-8")))


def _where(places):
    return ", ".join(f"{p}:{n}" for p, n in places)


def test_every_variable_read_is_documented_and_every_documented_one_read():
    reads = scan()
    docs = documented()
    problems = []
    for places in [reads.get(None)] if None in reads else []:
        problems.append(f"environment read with a name that is not a literal (say which variable): {_where(places)}")
    lite_read = {n: p for n, p in reads.items() if n and n.startswith("LITE_")}
    for name in sorted(set(lite_read) - docs):
        problems.append(f"{name} is read but docs/configuration.md does not list it: {_where(lite_read[name])}")
    for name in sorted(docs - set(lite_read)):
        problems.append(f"{name} is listed in docs/configuration.md but the code no longer reads it")
    for name, places in sorted((n, p) for n, p in reads.items() if n and not n.startswith("LITE_")):
        if name not in ALLOWED:
            problems.append(f"{name} is read ({_where(places)}): not lite's, and not in this test's ALLOWED list")
    for name, only in ONLY_IN.items():
        other = [(p, n) for p, n in lite_read.get(name, []) if p != only]
        if other:
            problems.append(f"{name} is read outside {only}: {_where(other)}")
    if len(lite_read) > MAX_LITE_VARIABLES:
        problems.append(f"{len(lite_read)} LITE_* variables are read, at most {MAX_LITE_VARIABLES} are allowed "
                        f"(settings a benchmark compares are BackendConfig fields): {', '.join(sorted(lite_read))}")
    assert not problems, "\n".join(problems)


def test_the_scan_sees_each_form_of_read():
    tree = ast.parse("\n".join([
        "import os", "from os import environ, getenv",
        "a = os.environ.get('LITE_A', '1')", "b = os.environ['LITE_B']", "c = os.getenv('LITE_C')",
        "d = environ.get('LITE_D')", "e = 'LITE_E' in os.environ", "f = getenv('HOME')",
        "NAME = 'LITE_G'", "h = os.environ.get(NAME)", "i = 'see LITE_H in the docs'",
    ]))
    names = [n for n, _ in reads_in(tree)]
    assert sorted(filter(None, names)) == ["HOME", "LITE_A", "LITE_B", "LITE_C", "LITE_D", "LITE_E", "LITE_G"]
    assert names.count(None) == 1 and names.count("LITE_A") == 1   # os.environ.get(NAME): not a literal


# ---- the import graph ----------------------------------------------------------------------------

# The layers, as data (docs/design.md, "Layout"). Each rule: what it says, the modules it applies to
# (prefixes: a module matches a prefix when it is that module or inside it), and either `only`
# (all they may import from the product) or `not` (what they may not import). A rule whose modules
# do not exist yet checks nothing.
LEAVES = ("lite.errors",)          # what kernels/ may import from lite's own modules
PURE = LEAVES + ("lite.files", "lite.progress", "lite.engine.sampling", "lite.chain.chunking",
                 "lite.chain.cost_profile", "lite.chain.cost_fit", "lite.chain.cost_tables",
                 "lite.chain.timeline")
ABOVE_ENGINE = ("lite.server", "lite.api", "lite.bench", "lite.bench_serve", "lite.cli")
LAYERS = [
    ("kernels/ imports only kernels and the leaves (lite.errors)",
     ("lite.kernels",), {"only": ("lite.kernels",) + LEAVES}),
    ("models/ imports no backend, no kernels and nothing above it (stage chain, engine, server, bench, api, cli)",
     ("lite.models",), {"not": ("lite.backends", "lite.kernels", "lite.chain", "lite.engine") + ABOVE_ENGINE}),
    ("lite/backends/ imports nothing above the ops (models, stage chain, engine, server, bench, api, cli)",
     ("lite.backends",), {"not": ("lite.models", "lite.chain", "lite.engine") + ABOVE_ENGINE}),
    ("lite/chain/ (the stage chain, its chunk model and calibration) imports no model and nothing of the engine "
     "or above it", ("lite.chain",), {"not": ("lite.models", "lite.engine") + ABOVE_ENGINE}),
    ("lite/engine/ imports nothing above it (server, bench, api, cli)",
     ("lite.engine",), {"not": ABOVE_ENGINE}),
    ("the leaves (lite/files/, sampling, the chunk model, timeline: pure, no device) import only leaves",
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
    assert violations({"lite.kernels.x": {"lite.errors": 1, "lite.engine.engine": 2}}) == [
        (LAYERS[0][0], "lite.kernels.x", "lite.engine.engine", 2)]
    chain_rule = next(rule for rule, applies, _ in LAYERS if applies == ("lite.chain",))
    assert violations({"lite.chain.pipeline": {"lite.engine.stage": 3, "lite.backends.cpu": 4}}) == [
        (chain_rule, "lite.chain.pipeline", "lite.engine.stage", 3)]


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
    assert not bad, f"{len(bad)} import(s) against docs/design.md's layers:\n" + "\n".join(lines)
