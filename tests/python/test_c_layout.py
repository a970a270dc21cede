"""The C library's shape: the generic layer (the files directly in lib/src) names no backend,
the installed library exports the public API alone, and each C test is named once.

The first tests read the sources as text, so they need no build: each backend's folder under
lib/src (cpu, dummy, standin, cuda) holds what it defines, and a file of the generic layer
may neither include a header of those folders nor name a function, type, variable or macro
they own. Public functions count too: the generic layer must not call ferry_cpu_backend_new
any more than a backend's private helpers; it asks the buffer type or the backend through
their interfaces (lib/src/ferry-impl.h) instead.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "lib" / "src"
INCLUDE = ROOT / "lib" / "include"

#: The backends' folders under lib/src; every other file directly in lib/src is generic.
BACKENDS = ("cpu", "dummy", "standin", "cuda")
C_SUFFIXES = (".c", ".h", ".cu")
C_KEYWORDS = {"extern", "void", "int", "char", "bool", "struct", "union", "enum", "const", "typedef"}

_TOKEN = re.compile(
    r"""//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""", re.S)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_FUNC_HEADER = re.compile(r"(\w+)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:const\s*)?$", re.S)
_FUNC_DECL = re.compile(r"(\w+)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:__attribute__\s*\(\(.*\)\)\s*)?$", re.S)


def strip_c(text: str) -> str:
    """Return C text with comments blanked and string and character literals emptied.

    Parameters
    ----------
    text : str
        C or CUDA source.

    Returns
    -------
    str
        The same code with ``""`` and ``''`` for literals and a space for each comment;
        line breaks inside comments are kept so that line numbers stay the same.
    """
    def repl(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok.startswith("/"):
            return " " + "\n" * tok.count("\n")
        return tok[0] * 2
    return _TOKEN.sub(repl, text)


def _preprocessor_lines(code: str) -> Tuple[str, List[str]]:
    """Split code into its C without preprocessor lines, and those lines (joined)."""
    code = code.replace("\\\n", " ")
    kept: List[str] = []
    directives: List[str] = []
    for line in code.split("\n"):
        (directives if line.lstrip().startswith("#") else kept).append(line)
    return "\n".join(kept), directives


def _top_level_statements(code: str) -> Iterator[Tuple[str, str]]:
    """Yield each top-level statement's text and how it ends: ``";"`` or ``"{"`` (a body)."""
    depth = 0
    start = 0
    i = 0
    aggregate_depth: List[int] = []  # braces opened by struct bodies and initializers
    text = ""
    while i < len(code):
        c = code[i]
        if c == "{":
            if depth == 0:
                head = text + code[start:i]
                if re.search(r'\bextern\s*""\s*$', head):  # extern "C" { ... }: no scope of its own
                    text, start = "", i + 1
                    i += 1
                    continue
                if _FUNC_HEADER.search(head.strip()) and not re.search(r"=\s*$", head):
                    yield head, "{"
                    text = ""
                else:
                    aggregate_depth.append(depth)
                    text = head + " {} "
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:  # the end of an extern "C" block
                depth = 0
            if depth == 0:
                if aggregate_depth and aggregate_depth[-1] == 0:
                    aggregate_depth.pop()
                else:
                    text = ""
                start = i + 1
        elif c == ";" and depth == 0:
            yield text + code[start:i], ";"
            text = ""
            start = i + 1
        if c == "{" and depth == 1 and not text:
            start = i + 1
        i += 1


def defined_names(path: Path) -> Set[str]:
    """Return what a backend file gives the rest of the library.

    Parameters
    ----------
    path : Path
        A .c, .cu or .h file in a backend's folder.

    Returns
    -------
    set of str
        Functions it defines or declares without ``static``, variables it declares without
        ``static``; for a header also its types (typedefs, struct, union and enum tags, enum
        constants) and macros, which a .c file keeps to itself.
    """
    code, directives = _preprocessor_lines(strip_c(path.read_text()))
    header = path.suffix == ".h"
    names: Set[str] = set()
    if header:
        for d in directives:
            m = re.match(r"\s*#\s*define\s+(\w+)", d)
            if m and not m.group(1).endswith("_H"):
                names.add(m.group(1))
    for stmt, end in _top_level_statements(code):
        words = set(_IDENT.findall(stmt))
        if "static" in words:
            continue
        flat = " ".join(stmt.split())
        if end == "{":
            m = _FUNC_HEADER.search(flat)
            if m:
                names.add(m.group(1))
            continue
        if "typedef" in words or re.match(r"^(?:struct|union|enum)\b[^=]*\{\}\s*$", flat):
            if header:  # a type: its tag and its typedef name; a .c file's types are its own
                m = re.search(r"\(\s*\*\s*(\w+)\s*\)|(\w+)\s*(?:\[[^\]]*\]\s*)*$", flat)
                if m and "typedef" in words:
                    names.add(m.group(1) or m.group(2))
                names.update(re.findall(r"\b(?:struct|union|enum)\s+(\w+)", flat))
            continue
        m = _FUNC_DECL.search(flat)
        if m and "=" not in flat.split("(")[0]:
            names.add(m.group(1))
            continue
        m = re.search(r"(\w+)\s*(?:\[[^\]]*\]\s*)*(?:=.*)?$", flat)
        if m:  # a variable
            names.add(m.group(1))
    return names - C_KEYWORDS


def generic_files() -> List[Path]:
    """The generic layer: every C source and header directly in lib/src."""
    return sorted(p for p in SRC.iterdir() if p.is_file() and p.suffix in C_SUFFIXES)


def backend_files() -> Dict[str, List[Path]]:
    """Each backend's C sources and headers, by folder."""
    return {b: sorted(p for p in (SRC / b).rglob("*") if p.suffix in C_SUFFIXES) for b in BACKENDS}


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _resolve_include(name: str, including: Path) -> Optional[Path]:
    # a file outside the checkout (a planted one) is read as if it stood in lib/src
    here = including.parent if including.is_relative_to(ROOT) else SRC
    for base in (here, SRC, INCLUDE):
        if (base / name).is_file():
            return (base / name).resolve()
    return None


def include_violations(files: List[Path]) -> List[str]:
    """Where a generic file includes a header of a backend's folder.

    Parameters
    ----------
    files : list of Path
        The generic layer's files.

    Returns
    -------
    list of str
        ``file:line: includes header`` for each such include; a header the include path
        does not find but a backend's folder holds counts too.
    """
    backend_dirs = [(SRC / b).resolve() for b in BACKENDS]
    backend_headers = {p.name for ps in backend_files().values() for p in ps if p.suffix == ".h"}
    found = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
            if not m:
                continue
            target = _resolve_include(m.group(1), f)
            inside = target is not None and any(d in target.parents for d in backend_dirs)
            if inside or (target is None and Path(m.group(1)).name in backend_headers):
                found.append(f"{_shown(f)}:{n}: includes {m.group(1)}")
    return found


def name_violations(files: List[Path]) -> List[str]:
    """Where a generic file names what a backend's folder defines.

    Parameters
    ----------
    files : list of Path
        The generic layer's files.

    Returns
    -------
    list of str
        ``file:line: name (backend)`` for each whole-word use outside comments and strings.
    """
    owner: Dict[str, str] = {}
    for backend, paths in backend_files().items():
        for p in paths:
            for name in defined_names(p):
                owner.setdefault(name, backend)
    if not owner:
        return []
    word = re.compile(r"\b(" + "|".join(sorted(map(re.escape, owner), key=len, reverse=True)) + r")\b")
    found = []
    for f in files:
        for n, line in enumerate(strip_c(f.read_text()).splitlines(), 1):
            for m in word.finditer(line):
                found.append(f"{_shown(f)}:{n}: {m.group(1)} ({owner[m.group(1)]}/)")
    return found


def test_backend_folders_exist() -> None:
    for b in BACKENDS:
        assert (SRC / b).is_dir(), f"lib/src/{b}/ is missing"
        assert any((SRC / b).iterdir())


def test_what_a_backend_defines_is_found() -> None:
    # the collector itself: a few names each backend is known to own, and none it keeps static
    owned = {b: set().union(*(defined_names(p) for p in ps)) for b, ps in backend_files().items()}
    assert {"ferry_cpu_backend_new", "ferry_cpu_compute_graph", "ferry_cpu_op_supported",
            "ferry_cpu_buffer_type"} <= owned["cpu"]
    assert {"ferry_dummy_backend_new", "ferry_dummy_backend_new_cpu_ops"} <= owned["dummy"]
    assert {"ferry_standin_backend_new", "ferry_worker_copy_queue_new"} <= owned["standin"]
    assert {"ferry_cuda_backend_new", "ferry_cuda_available", "ferry_cuda_device_bufts", "device_buft_ctx",
            "CUDA_TRY", "ferry_cuda_compute_node"} <= owned["cuda"]
    assert not {"cpu_name", "synthetic_get_base", "backend_ctx", "tensor_at"} & set().union(*owned.values())


def test_generic_layer_includes_no_backend_header() -> None:
    assert include_violations(generic_files()) == []


def test_generic_layer_names_no_backend() -> None:
    assert name_violations(generic_files()) == []


def test_layout_checks_can_fail(tmp_path: Path) -> None:
    # a generic file that includes a backend's header and calls its constructor is caught;
    # the same names in a comment or a string are not
    planted = tmp_path / "planted.c"
    planted.write_text('#include "standin/copy-queue.h"\n/* ferry_cuda_backend_new in a comment */\n'
                       'int f(void) { return ferry_cpu_backend_new(0) + "ferry_dummy_backend_new"[0]; }\n')
    assert include_violations([planted]) == [f"{planted}:1: includes standin/copy-queue.h"]
    assert name_violations([planted]) == [f"{planted}:3: ferry_cpu_backend_new (cpu/)"]


# ---------------------------------------------------------------- what the library exports


def api_functions(cdef: str) -> Set[str]:
    """Return the functions a cdef declares.

    Parameters
    ----------
    cdef : str
        The preprocessed umbrella header (ferry_cdef.h, installed beside the library).

    Returns
    -------
    set of str
        The name of every function declaration at the top level.
    """
    code, _ = _preprocessor_lines(strip_c(cdef))
    names = set()
    for stmt, end in _top_level_statements(code):
        flat = " ".join(stmt.split())
        m = _FUNC_DECL.search(flat)
        if end == ";" and m and "typedef" not in flat.split() and "=" not in flat.split("(")[0]:
            names.add(m.group(1))
    return names


def defined_symbols(library: str) -> Dict[str, str]:
    """Every symbol a shared library exports, with its kind, as ``nm -D --defined-only`` lists them."""
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True, text=True).stdout
    return {f[2]: f[1] for f in (line.split() for line in out.splitlines()) if len(f) == 3}


def exported_functions(library: str) -> Set[str]:
    """The functions a shared library exports."""
    return {name for name, kind in defined_symbols(library).items() if kind in "TWi"}


def test_exports_are_the_public_api() -> None:
    if shutil.which("nm") is None:
        pytest.skip("no nm on this machine")
    import ferry
    from ferry import _binding

    api = api_functions(Path(_binding.CDEF_PATH).read_text())
    assert {"ferry_last_error", "ferry_cpu_backend_new", "ferry_cuda_available", "ferry_tensor_memory"} <= api
    exported = exported_functions(_binding.LIB_PATH)
    if ferry.build_info()["fake_cudart"]:  # the test build's fake runtime: its hooks for the tests
        exported = {e for e in exported if not e.startswith("fake_cudart_")}
    if "__gcov_master" in defined_symbols(_binding.LIB_PATH):  # a coverage build: gcc links in libgcov,
        exported.discard("mangle_path")  # which exports this function of its own
    assert sorted(exported - api) == [], "exported but not declared in lib/include"
    assert sorted(api - exported) == [], "declared in lib/include but not exported"


def test_api_functions_reads_declarations_only() -> None:
    cdef = ("typedef struct ferry_x ferry_x;\ntypedef void (*ferry_cb)(int a);\n"
            "struct s { int (*get)(int); };\nconst char * ferry_name(const ferry_x * x);\n"
            "ferry_status ferry_make(int (*f)(int), ferry_x ** out);\nenum { A = 1 };\n")
    assert api_functions(cdef) == {"ferry_name", "ferry_make"}


# ---------------------------------------------------------------- C test names, written once

C_TESTS = ROOT / "tests" / "c"


def _list_tests() -> ModuleType:
    """tests/c/list-tests.py, the script meson asks for each C program's test names."""
    spec = importlib.util.spec_from_file_location("list_tests", C_TESTS / "list-tests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def c_test_functions(text: str) -> Set[str]:
    """The test functions a C test program defines: ``static void test_x(void)``, written
    out or made by a macro of the file (``#define SCENARIO(name, ...) static void test_##name``)."""
    found = set(re.findall(r"^static void (test_\w+)\(void\)", text, re.M))
    for macro in re.findall(r"#\s*define\s+(\w+)\(\s*\w+[^)]*\)\s*\\?\s*static void test_##", text):
        found |= {"test_" + n for n in re.findall(r"^" + macro + r"\((\w+)", text, re.M)}
    return found


def unlisted_tests(text: str) -> Tuple[Set[str], Set[str]]:
    """Return a test program's test functions missing from its table, and table entries
    that name no test function of the file (every branch of the table's #ifs taken)."""
    in_table = {fn for _, fn in _list_tests().entries(text, None)}
    defined = c_test_functions(text)
    return defined - in_table, in_table - defined


@pytest.mark.parametrize("program", sorted(p.name for p in C_TESTS.glob("test_*.c")))
def test_every_c_test_is_in_its_table(program: str) -> None:
    text = (C_TESTS / program).read_text()
    missing, stray = unlisted_tests(text)
    assert missing == set(), "test functions that no table entry runs"
    assert stray == set(), "table entries that name no test function"
    names = [n for n, _ in _list_tests().entries(text, None)]
    assert len(names) == len(set(names)) and names


def test_c_test_names_are_not_written_again() -> None:
    # the names live in the programs alone: meson.build lists programs, never a test's name
    build = (C_TESTS / "meson.build").read_text()
    for p in C_TESTS.glob("test_*.c"):
        for name, _ in _list_tests().entries(p.read_text(), None):
            assert f"'{name}'" not in build, f"{name} ({p.name}) is written in tests/c/meson.build too"


def test_listing_follows_the_compile_and_refuses_what_it_cannot_read() -> None:
    lt = _list_tests()
    text = ("static void test_a(void) {}\nstatic void test_b(void) {}\nstatic void test_c(void) {}\n"
            "static void test_forgotten(void) {}\n"
            "static const check_test tests[] = {\n    {\"a\", test_a},\n#ifdef FERRY_WITH_CUDA\n"
            "    {\"b\", test_b},\n#else\n    {\"c\", test_c},\n#endif\n};\n")
    assert lt.entries(text, set()) == [("a", "test_a"), ("c", "test_c")]
    assert lt.entries(text, {"FERRY_WITH_CUDA"}) == [("a", "test_a"), ("b", "test_b")]
    assert unlisted_tests(text) == ({"test_forgotten"}, set())
    made = "#define T(name) \\\n    static void test_##name(void) {}\nT(d)\n" + text.replace("test_forgotten", "test_d")
    assert unlisted_tests(made) == ({"test_d"}, set())
    with pytest.raises(ValueError):
        lt.entries(text.replace("#ifdef FERRY_WITH_CUDA", "#if defined(A) && defined(B)"), set())
