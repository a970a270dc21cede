#!/usr/bin/env python3
"""Print the names of a C test program's tests, one a line: the first field of each entry
of its table (`static const check_test tests[] = { {"name", fn}, ... };`, check.h), so that
the program is the one place a test is named. tests/c/meson.build registers one meson test
per name.

Entries under #ifdef, #ifndef, #if [defined] NAME, #else and #endif are kept or left out as
the compiler would keep them, given the -D options of the program's compile (passed on as
they are, other options ignored); any other directive in the table is refused, so that a
condition this script cannot read fails the configure instead of registering the wrong
tests.

    list-tests.py FILE [COMPILER_ARGS...]
"""

from __future__ import annotations

import re
import sys
from typing import List, Optional, Set

TABLE = re.compile(r"static\s+const\s+check_test\s+\w+\[\]\s*=\s*\{(.*?)\n\};", re.S)
ENTRY = re.compile(r'^\s*\{\s*"([^"]+)"\s*,\s*(\w+)\s*\}\s*,?\s*$')


def table_lines(text: str) -> List[str]:
    """The lines of the file's one test table, between its braces."""
    tables: List[str] = TABLE.findall(text)
    if len(tables) != 1:
        raise ValueError(f"expected one check_test table, found {len(tables)}")
    return tables[0].strip("\n").split("\n")


def entries(text: str, defined: Optional[Set[str]]) -> List[tuple[str, str]]:
    """Return the (name, function) entries of the table that a compile with defined keeps.

    Parameters
    ----------
    text : str
        The test program's source.
    defined : set of str, optional
        The macros the compile defines; None keeps every branch of every #if.

    Returns
    -------
    list of (str, str)
        The entries in table order.

    Raises
    ------
    ValueError
        For a line of the table that is neither an entry, a blank, a comment nor a
        directive this script reads.
    """
    stack: List[bool] = []  # whether each open #if's branch is kept
    out = []
    for line in table_lines(text):
        s = line.strip()
        m = re.match(r"#\s*(ifdef|ifndef|if)\s+(?:defined\s*\(?\s*)?(\w+)\s*\)?\s*$", s)
        if m:
            kept = defined is None or (m.group(2) in defined) != (m.group(1) == "ifndef")
            stack.append(kept)
        elif re.match(r"#\s*else\s*$", s):
            stack[-1] = defined is None or not stack[-1]
        elif re.match(r"#\s*endif\b", s):
            stack.pop()
        elif ENTRY.match(s):
            if all(stack):
                name, fn = ENTRY.match(s).groups()  # type: ignore[union-attr]
                out.append((name, fn))
        elif s and not s.startswith(("//", "/*")):
            raise ValueError(f"cannot read this line of the test table: {line!r}")
    if stack:
        raise ValueError("an #if in the test table is not closed")
    return out


def main(argv: List[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    defined = {a[2:].split("=")[0] for a in argv[2:] if a.startswith("-D")}
    with open(argv[1], encoding="utf-8") as f:
        text = f.read()
    try:
        names = [name for name, _ in entries(text, defined)]
    except ValueError as e:
        print(f"{argv[1]}: {e}", file=sys.stderr)
        return 1
    if len(set(names)) != len(names):
        print(f"{argv[1]}: a test name is in the table twice", file=sys.stderr)
        return 1
    print("\n".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
