#!/usr/bin/env python3
"""Fails when top-level modules of src/ import each other in a circle.

The rings of the crate run one way (protocol codec -> session -> array interface -> core ->
I/O; see ARCHITECTURE.md). An edge A -> B is any `crate::B` path in a file of module A
(src/A.rs or src/A/**), unit-test modules at the end of a file excepted. Prints the edges of
every cycle found and exits 1; prints the module order and exits 0 when there is none.
Usage: scripts/module_cycles.py [SRC_DIR]"""
import pathlib
import re
import sys

src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "src")
path_re = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
tests_re = re.compile(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", re.S)

graph: dict[str, set[str]] = {}
for file in src.rglob("*.rs"):
    module = file.relative_to(src).parts[0].removesuffix(".rs")
    if module in ("lib", "main"):
        continue
    text = tests_re.sub("", file.read_text(encoding="utf-8", errors="replace"))
    graph.setdefault(module, set()).update(m for m in path_re.findall(text) if m != module)
for deps in graph.values():
    deps &= graph.keys()

# Depth-first search; a back edge closes a cycle.
state: dict[str, int] = {}  # 1 = on the stack, 2 = done
stack: list[str] = []
cycles: list[list[str]] = []
order: list[str] = []


def visit(m: str) -> None:
    state[m] = 1
    stack.append(m)
    for d in sorted(graph[m]):
        if state.get(d) == 1:
            cycles.append(stack[stack.index(d):] + [d])
        elif d not in state:
            visit(d)
    stack.pop()
    state[m] = 2
    order.append(m)


sys.setrecursionlimit(10_000)
for m in sorted(graph):
    if m not in state:
        visit(m)
if cycles:
    for c in cycles:
        print("import cycle: " + " -> ".join(c))
    sys.exit(1)
print(f"no import cycles among {len(graph)} top-level modules; lowest first: {' '.join(order)}")
