"""backend/policy imports only pure modules: an allowlist, so new project parts are caught too.

import-linter (run in CI) forbids named I/O libraries; this test closes the gap for anything
not on its list, including packages of this project that do not exist yet.
"""

import grimp

ALLOWED = {
    "__future__",
    "abc",
    "bisect",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "heapq",
    "itertools",
    "math",
    "numpy",
    "random",
    "statistics",
    "typing",
    "xxhash",
}


def test_policy_imports_only_pure_modules() -> None:
    graph = grimp.build_graph("backend", include_external_packages=True)
    imported = set()
    for module in graph.find_children("backend.policy") | {"backend.policy"}:
        for target in graph.find_modules_directly_imported_by(module):
            if not target.startswith("backend.policy"):
                imported.add(target.split(".")[0] if not target.startswith("backend") else target)
    assert imported <= ALLOWED, f"backend.policy imports {sorted(imported - ALLOWED)}"
