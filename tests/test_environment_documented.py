"""Every environment variable the product reads is documented, and there are at most three of them.

Scans the sources of lite/, kernels/, models/ and cli/ (the installed package) for reads of the
environment: os.environ.get(NAME), os.environ[NAME], os.getenv(NAME), environ.get(NAME),
NAME in os.environ, os.environ.setdefault / pop(NAME), and any string constant that is a whole
LITE_* name (a name kept in a constant and read later counts as read). It fails naming each LITE_*
variable the code reads that docs/configuration.md does not list, each that the page lists but the
code no longer reads, a read of the environment whose name is not a literal, and any other variable
not in ALLOWED below. Settings a benchmark compares belong in lite.backend_config.BackendConfig,
not in the environment (docs/configuration.md)."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("lite", "kernels", "models", "cli")
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
