"""The C library's shape: which folder of lib/src may use which, which layer of the generic
layer may call which, the installed library exports the public API alone, and each C test is
named once.

The first tests read the sources as text, so they need no build. Each backend's folder under
lib/src (cpu, dummy, standin, cuda) holds what it defines; a file may include the headers and
name the functions, types, variables and macros of its own folder, of the generic layer (the
files directly in lib/src), and of the backend folders its row of MAY_INCLUDE lists: none for
the generic layer, which asks the buffer type or the backend through their interfaces
(lib/src/backend-impl.h) instead. Of the generic layer's own headers a backend includes only
those of BACKEND_HEADERS and names nothing the others declare: the copy path's internals
(copy-impl.h) and the rest of the generic layer's (ferry-impl.h, the allocator's, the
scheduler's) are the generic layer's alone. Public functions count too: the generic layer must not call
ferry_cpu_backend_new any more than a backend's private helpers. Within the generic layer a
file calls functions of its own layer and lower ones (GENERIC_LAYERS), never upward.
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

#: Whose headers a folder's files may include, and whose names they may use, besides their own
#: folder's and the generic layer's ("": the files directly in lib/src). The backends stack:
#: the dummy backend runs the CPU kernels on its real memory and takes the CPU's 2-D transfers
#: of host memory; the stand-in device is a dummy backend claiming the CPU kernels' ops, with
#: the CPU's transfers and the host's memory figures. The CPU and CUDA backends stand on the
#: generic layer alone, and the generic layer on no backend.
MAY_INCLUDE: Dict[str, Tuple[str, ...]] = {
    "": (),
    "cpu": (),
    "dummy": ("cpu",),
    "standin": ("cpu", "dummy"),
    "cuda": (),
}

#: The headers directly in lib/src that a backend may include: the interfaces it implements and
#: what it may call (backend-impl.h), the graphs it computes (graph-impl.h), the allocation hook.
#: Every other header there is the generic layer's own. docs/architecture.md says which is whose.
BACKEND_HEADERS: Tuple[str, ...] = ("backend-impl.h", "graph-impl.h", "alloc-hook.h")

#: The generic layer's layers, lowest first, and their .c files: a file calls functions of its
#: own layer's files and of lower ones, never of a higher one. docs/architecture.md's table
#: lists the same rows in the same order.
GENERIC_LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("errors, sizes and allocation", ("error.c", "sizes.c", "zalloc.c", "alloc-hook.c", "build-info.c")),
    ("types and tensors", ("types.c", "tensor.c", "quant.c")),
    ("buffers and buffer types", ("buffer.c", "transfer.c", "host-buffer.c", "foreign-buffer.c", "dlpack.c")),
    ("backends", ("backend.c", "event.c")),
    ("graphs, ops, allocator", ("graph.c", "ops.c", "alloc.c", "alloc-blocks.c")),
    ("copy path and plans", ("copy-path.c", "copy-plan.c", "copy-compact.c", "copy-ragged.c", "copy-paged.c")),
    ("scheduler and prefetch", ("sched.c", "sched-prefetch.c", "sched-fetch.c")),
    ("KV cache and decode step", ("kv-layers.c", "kv-cache.c", "paged-kv.c", "block-pool.c", "step-graph.c")),
)
#: Each generic .c file's layer: its index in GENERIC_LAYERS.
GENERIC_LAYER_OF: Dict[str, int] = {f: i for i, (_, files) in enumerate(GENERIC_LAYERS) for f in files}

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


def folder_of(path: Path) -> str:
    """The folder a C file belongs to: a backend's name, or ``""`` for the generic layer
    (a file outside lib/src's backend folders, a planted one included)."""
    if path.is_relative_to(SRC) and len(path.relative_to(SRC).parts) > 1:
        return path.relative_to(SRC).parts[0]
    return ""


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _resolve_include(name: str, including: Path) -> Optional[Path]:
    # a file outside the checkout (a planted one) is read as if it stood in lib/src
    here = including.parent if including.is_relative_to(ROOT) else SRC
    for base in (here, SRC, INCLUDE):
        if (base / name).is_file():
            return (base / name).resolve()
    return None


def generic_own_header(path: Path) -> bool:
    """Whether path is a header directly in lib/src that no backend may include (not one of
    ``BACKEND_HEADERS``)."""
    return path.parent == SRC.resolve() and path.suffix == ".h" and path.name not in BACKEND_HEADERS


def include_violations(files: List[Path], folder: Optional[str] = None) -> List[str]:
    """Where a file includes a header of a backend's folder that its row of
    ``MAY_INCLUDE`` leaves out, or, in a backend's folder, a header of the generic layer's own
    (one not in ``BACKEND_HEADERS``).

    Parameters
    ----------
    files : list of Path
        C files of lib/src.
    folder : str, optional
        The folder to hold them to (a key of ``MAY_INCLUDE``); by default each file's own.

    Returns
    -------
    list of str
        ``file:line: includes header`` for each such include; a header the include path
        does not find but a backend's folder holds counts too.
    """
    header_owner = {p.name: b for b, ps in backend_files().items() for p in ps if p.suffix == ".h"}
    found = []
    for f in files:
        own = folder if folder is not None else folder_of(f)
        allowed = {"", own, *MAY_INCLUDE[own]}  # the generic layer is open to every folder
        for n, line in enumerate(f.read_text().splitlines(), 1):
            m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
            if not m:
                continue
            target = _resolve_include(m.group(1), f)
            if target is not None:
                owner = folder_of(target)
            else:
                owner = header_owner.get(Path(m.group(1)).name, "")
            if owner not in allowed or (own != "" and target is not None and generic_own_header(target)):
                found.append(f"{_shown(f)}:{n}: includes {m.group(1)}")
    return found


def name_violations(files: List[Path], folder: Optional[str] = None) -> List[str]:
    """Where a file names what a backend's folder defines that its row of ``MAY_INCLUDE``
    leaves out, or, in a backend's folder, what a header of the generic layer's own declares.

    Parameters
    ----------
    files : list of Path
        C files of lib/src.
    folder : str, optional
        The folder to hold them to (a key of ``MAY_INCLUDE``); by default each file's own.

    Returns
    -------
    list of str
        ``file:line: name (backend/)`` or ``file:line: name (header)`` for each whole-word use
        outside comments and strings.
    """
    owner: Dict[str, str] = {}  # a backend's folder, or the generic layer's own header
    for backend, paths in backend_files().items():
        for p in paths:
            for name in defined_names(p):
                owner.setdefault(name, backend)
    for p in generic_files():  # their names in ferry's namespace: a short one (part) is a word too
        if generic_own_header(p.resolve()):
            for name in defined_names(p):
                if name.lower().startswith("ferry_"):
                    owner.setdefault(name, p.name)
    if not owner:
        return []
    word = re.compile(r"\b(" + "|".join(sorted(map(re.escape, owner), key=len, reverse=True)) + r")\b")
    found = []
    for f in files:
        own = folder if folder is not None else folder_of(f)
        allowed = {"", own, *MAY_INCLUDE[own]}  # the generic layer is open to every folder
        for n, line in enumerate(strip_c(f.read_text()).splitlines(), 1):
            for m in word.finditer(line):
                by = owner[m.group(1)]
                if by in BACKENDS and by not in allowed:
                    found.append(f"{_shown(f)}:{n}: {m.group(1)} ({by}/)")
                elif by not in BACKENDS and own != "":
                    found.append(f"{_shown(f)}:{n}: {m.group(1)} ({by})")
    return found


def call_violations(files: List[Path], layer_of: Dict[str, int]) -> List[str]:
    """Where a generic file calls a function that a file of a higher layer defines.

    Parameters
    ----------
    files : list of Path
        .c files of the generic layer.
    layer_of : dict of str to int
        Each generic .c file's layer (``GENERIC_LAYER_OF``; a planted file's name may be added).

    Returns
    -------
    list of str
        ``file:line: calls name (defining file)`` for each call, outside comments and strings,
        of a function defined in a file of a higher layer; calls within a layer are allowed.
    """
    definer: Dict[str, str] = {}
    for p in generic_files():
        if p.suffix == ".c":
            for name in defined_names(p):
                definer.setdefault(name, p.name)
    found = []
    for f in files:
        own = layer_of[f.name]
        for n, line in enumerate(strip_c(f.read_text()).splitlines(), 1):
            for m in re.finditer(r"\b(\w+)\s*\(", line):
                at = definer.get(m.group(1))
                if at is not None and at != f.name and layer_of[at] > own:
                    found.append(f"{_shown(f)}:{n}: calls {m.group(1)} ({at})")
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


def test_include_table_names_every_folder() -> None:
    assert set(MAY_INCLUDE) == {"", *BACKENDS}
    assert all(set(row) <= set(BACKENDS) for row in MAY_INCLUDE.values())
    assert MAY_INCLUDE[""] == (), "the generic layer includes no backend's header"


@pytest.mark.parametrize("folder", sorted(MAY_INCLUDE))
def test_includes_follow_the_table(folder: str) -> None:
    files = generic_files() if folder == "" else backend_files()[folder]
    assert include_violations(files) == []


@pytest.mark.parametrize("folder", sorted(MAY_INCLUDE))
def test_names_follow_the_table(folder: str) -> None:
    # what a folder may include it may name, and nothing else a backend defines
    files = generic_files() if folder == "" else backend_files()[folder]
    assert name_violations(files) == []


def test_layout_checks_can_fail(tmp_path: Path) -> None:
    # a generic file that includes a backend's header and calls its constructor is caught;
    # the same names in a comment or a string are not
    planted = tmp_path / "planted.c"
    planted.write_text('#include "standin/copy-queue.h"\n/* ferry_cuda_backend_new in a comment */\n'
                       'int f(void) { return ferry_cpu_backend_new(0) + "ferry_dummy_backend_new"[0]; }\n')
    assert include_violations([planted]) == [f"{planted}:1: includes standin/copy-queue.h"]
    assert name_violations([planted]) == [f"{planted}:3: ferry_cpu_backend_new (cpu/)"]
    # held to a backend's row: the dummy backend may use the CPU's, not the stand-in's
    assert include_violations([planted], "dummy") == [f"{planted}:1: includes standin/copy-queue.h"]
    assert name_violations([planted], "dummy") == []
    assert include_violations([planted], "standin") == []
    assert name_violations([planted], "cuda") == [f"{planted}:3: ferry_cpu_backend_new (cpu/)"]
    # the CPU backend built on the dummy one would turn the stack over
    upward = tmp_path / "upward.c"
    upward.write_text('#include "dummy/dummy-impl.h"\n'
                      'int g(void) { return ferry_dummy_backend_new_cpu_ops(0, 0, 0); }\n')
    assert include_violations([upward], "cpu") == [f"{upward}:1: includes dummy/dummy-impl.h"]
    assert name_violations([upward], "cpu") == [f"{upward}:2: ferry_dummy_backend_new_cpu_ops (dummy/)"]
    # a backend reaching into the copy path, by its header or by a name it declares, is caught;
    # the generic layer may
    into_copy = tmp_path / "into_copy.c"
    into_copy.write_text('#include "backend-impl.h"\n#include "copy-impl.h"\n'
                         'int h(void) { return ferry_copy_ragged(0, 0, 0, 0, 0, 0, 0); }\n')
    for backend in BACKENDS:
        assert include_violations([into_copy], backend) == [f"{into_copy}:2: includes copy-impl.h"]
        assert name_violations([into_copy], backend) == [f"{into_copy}:3: ferry_copy_ragged (copy-impl.h)"]
    assert include_violations([into_copy], "") == [] and name_violations([into_copy], "") == []


def test_backend_headers_reach_no_generic_own_header() -> None:
    # what a backend may include includes, in turn, only what a backend may include
    assert all((SRC / h).is_file() for h in BACKEND_HEADERS)
    assert include_violations([SRC / h for h in BACKEND_HEADERS], "cpu") == []


# ---------------------------------------------------------------- the generic layer calls downward


def generic_c_files() -> List[Path]:
    """The generic layer's .c files (its headers define no function bodies but inline ones)."""
    return [p for p in generic_files() if p.suffix == ".c"]


def test_every_generic_file_has_a_layer() -> None:
    assert sorted(GENERIC_LAYER_OF) == sorted(p.name for p in generic_c_files())


def test_generic_layer_calls_only_downward() -> None:
    assert call_violations(generic_c_files(), GENERIC_LAYER_OF) == []


def test_layer_table_is_architecture_md_s() -> None:
    # the table of docs/architecture.md lists the same files, layer by layer, in the same order
    doc = (ROOT / "docs" / "architecture.md").read_text()
    c_part = doc[doc.index("## C: the library"):doc.index("## Python: the binding")]
    rows = [line for line in c_part.splitlines() if line.startswith("|") and "`lib/src`:" in line]
    documented = [set(re.findall(r"`([\w-]+\.c)`", row.split("`lib/src`:")[1])) for row in rows]
    assert [{f for f, i in GENERIC_LAYER_OF.items() if i == layer} for layer in range(len(GENERIC_LAYERS))] \
        == documented
    assert [name for name, _ in GENERIC_LAYERS] == [row.split("|")[1].strip() for row in rows]


def test_call_check_can_fail(tmp_path: Path) -> None:
    # a tensor-layer file that asks the buffers' registry is caught; a call within its layer,
    # downward, or in a comment or string is not
    planted = tmp_path / "planted.c"
    planted.write_text('/* ferry_backend_synchronize(b) */\n'
                       'int f(const ferry_tensor * t) {\n'
                       '    ferry_type_valid(t->type); ferry_fail(0, "ferry_sched_new(x)");\n'
                       '    return ferry_buffer_id_is_live(t->buffer_id);\n}\n')
    layers = {**GENERIC_LAYER_OF, "planted.c": GENERIC_LAYER_OF["tensor.c"]}
    assert call_violations([planted], layers) == [f"{planted}:4: calls ferry_buffer_id_is_live (buffer.c)"]
    layers["planted.c"] = GENERIC_LAYER_OF["buffer.c"]
    assert call_violations([planted], layers) == []


# ---------------------------------------------------------------- the headers meson installs


def strip_meson_comments(meson: str) -> str:
    """meson text without its comments (from a # outside a string to the end of its line)."""
    return re.sub(r"('(?:\\.|[^'\\\n])*')|#[^\n]*", lambda m: m.group(1) or "", meson)


def installed_headers(meson_build: str, lib_meson_build: str) -> Set[str]:
    """The public headers the build installs, as paths from the root.

    Parameters
    ----------
    meson_build : str
        The top meson.build, whose ``ferry_headers = files(...)`` lists ferry/*.h.
    lib_meson_build : str
        lib/meson.build, whose ``install_headers`` calls install the umbrella and that list.

    Returns
    -------
    set of str
        lib/include/ferry.h where lib/meson.build installs it, and each header of
        ``ferry_headers`` where lib/meson.build installs that list.
    """
    found: Set[str] = set()
    calls = re.findall(r"install_headers\(([^)]*)\)", strip_meson_comments(lib_meson_build))
    if any("'include/ferry.h'" in c for c in calls):
        found.add("lib/include/ferry.h")
    if any(re.match(r"\s*ferry_headers\b", c) for c in calls):
        m = re.search(r"^ferry_headers\s*=\s*files\(([^)]*)\)", strip_meson_comments(meson_build), re.M)
        found |= set(re.findall(r"'([^']+)'", m.group(1))) if m else set()
    return found


def test_every_public_header_is_installed() -> None:
    # tools/c-install-check compares a real install with lib/include; this finds the same
    # gap without a build
    on_disk = {p.relative_to(ROOT).as_posix() for p in INCLUDE.rglob("*.h")}
    listed = installed_headers((ROOT / "meson.build").read_text(), (ROOT / "lib" / "meson.build").read_text())
    assert sorted(on_disk - listed) == [], "headers of lib/include that meson install leaves out"
    assert sorted(listed - on_disk) == []


def test_installed_headers_sees_a_header_left_out() -> None:
    top = "ferry_headers = files(\n  'lib/include/ferry/a.h',\n  # 'lib/include/ferry/b.h',\n)\n"
    lib = "install_headers('include/ferry.h')\ninstall_headers(ferry_headers, subdir: 'ferry')\n"
    assert installed_headers(top, lib) == {"lib/include/ferry.h", "lib/include/ferry/a.h"}
    assert installed_headers(top, "install_headers(ferry_headers, subdir: 'ferry')\n") == {"lib/include/ferry/a.h"}
    assert installed_headers(top, "# install_headers(ferry_headers)\n") == set()


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
