"""Test modules import what they share from tests/support, never from one another: a test
module that imports another runs that module's code (and its fixtures) twice over, and ties
the two together. Prints each import of a test module (tests/**/test_*.py) found anywhere
under tests/ and exits 1 if there is one."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in `path`, relative ones made absolute."""
    package = list(path.relative_to(TESTS.parent).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [(node.lineno, module)]
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def main() -> int:
    bad = [
        f"{path.relative_to(TESTS.parent)}:{line}: imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, module in imported(path)
        if module.startswith("tests.") and module.rsplit(".", 1)[-1].startswith("test_")
        and (TESTS.parent / (module.replace(".", "/") + ".py")).exists()
    ]  # fmt: skip
    print("\n".join(bad) or "no test module imports another")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
