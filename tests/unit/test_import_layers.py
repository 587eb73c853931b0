"""The package's import rules (issue 22, docs/architecture.md "Where things live"), checked on
the source: every ``import`` in ``src/litmt`` (module level, inside functions, under
``TYPE_CHECKING``, relative ones) is read with `ast`; nothing is imported.

1. No import cycle between files.
2. Imports run one way, down `LAYERS`: a module may import a module of a lower rank, or of its
   own subpackage; never one of a higher or of another subpackage of the same rank.
3. Inside ``deploy``, ``decoding`` and ``data``, imports run down `SUBLAYERS` too (down or
   sideways: modules of one rank may import each other): the server above the loader above
   the engines above the exports; the translator above the search; the DataModule above
   preparation above corpora and batching above tokenization.
4. ``models`` and ``attention`` (pure torch) import neither Lightning nor Hydra/OmegaConf.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "litmt"

# Rank of each top-level part of litmt: a module imports only lower ranks (or its own part).
# Same rank, different parts: no imports between them.
LAYERS: dict[str, int] = {
    "litmt": 7,  # __init__: the lazy public names (Translator, load_translator)
    "cli": 6,  # one module per command: the (cfg) jobs, the script runner, config checks
    "deploy": 5,  # CTranslate2 export and engine, load_translator (engine switch), HTTP server
    "training": 5,  # LightningModule, losses, schedules, callbacks (validation BLEU decodes)
    "decoding": 4,  # DecodeConfig, search, decode(), Translator, forced scoring, alignments
    "checkpoint": 3,  # save, load, average, compatibility
    "models": 2,  # pure torch: the Transformer and multi-head attention (owns the weights)
    "attention": 1,  # kernels without weights
    "data": 0,  # text, tokenizer, corpora, DataModule
    "runtime": -1,  # precision, FP8, devices, the Lightning internals litmt relies on
    "metrics": -1,  # sacrebleu wrappers
    "records": 0,  # result records: the one home of each published number (cores: runtime)
    "config": -1,  # the rules of every settings dataclass: key checks, renames, field docs
    "errors": -2,  # project exceptions
}
# Ranks inside a part, keyed by the module path below it (the longest key that prefixes a
# module's path is its rank; a module no key covers has no rank there).
SUBLAYERS: dict[str, dict[str, int]] = {
    "deploy": {
        "server": 4,  # the HTTP server: app, queue, admission, protocol, routes
        "loader": 3,  # load_translator: the one way any tool gets a translator
        "engines": 2,  # ct2 and onnx engines, their caches
        "export": 1,  # the shared base and one module per format
    },
    "decoding": {
        "distill": 6,  # a corpus translated by a teacher
        "analysis.forced": 6,  # forced scoring through the Translator
        "translator": 5,  # the torch engine's Translator
        "translator_base": 4,  # what every engine's translator shares
        "steering": 3,  # prefixes and constraints checked and encoded
        "languages": 3,
        "requests": 3,
        "batching": 3,
        "analysis.alignment": 3,
        "analysis.attention_maps": 3,
        "search": 2,  # decode() and the searches: below every translator
        "ensemble": 1,
        "config": 0,  # DecodeConfig
    },
    "data": {
        "datamodule": 3,  # the LightningDataModule on top
        "preparation.prepared": 2,  # corpus, tokenizer and caches without Lightning
        "preparation": 1,
        "corpora": 1,
        "batching": 1,
        "config": 1,
        "tokenization": 0,  # sentencepiece at the bottom
        "directions": 0,
        "text": 0,
    },
}
# Modules that must not import these third-party packages (pure torch).
NO_FRAMEWORK = {"models", "attention"}
FRAMEWORKS = ("lightning", "pytorch_lightning", "hydra", "omegaconf")


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(name: str) -> bool:
    return (SRC / name.replace(".", "/") / "__init__.py").exists()


def exists(name: str) -> bool:
    return is_package(name) or (SRC / (name.replace(".", "/") + ".py")).exists()


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import in `path`, relative ones resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append((target, node.lineno))
            for a in node.names:  # `from litmt.data import tokenizer`: the submodule too
                if exists(f"{target}.{a.name}"):
                    found.append((f"{target}.{a.name}", node.lineno))
    return found


def graph() -> dict[str, list[tuple[str, int]]]:
    """litmt module -> the litmt modules it imports (each with the line)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        out[module_name(path)] = [
            (t, line) for t, line in imports(path) if t.split(".")[0] == "litmt"
        ]
    return out


def part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "litmt"


def test_every_part_has_a_rank() -> None:
    parts = {part(m) for m in graph()}
    assert parts <= LAYERS.keys(), f"give these parts a rank in LAYERS: {parts - LAYERS.keys()}"


def test_imports_resolve_to_files() -> None:
    bad = [
        f"{m}:{line} imports {t}" for m, ts in graph().items() for t, line in ts if not exists(t)
    ]
    assert not bad, "\n".join(bad)


def sub_rank(module: str) -> tuple[str, int] | None:
    """(its key, its rank) in `SUBLAYERS` of its part, or None."""
    parts = module.split(".")
    table = SUBLAYERS.get(part(module), {})
    for n in range(len(parts) - 2, 0, -1):
        key = ".".join(parts[2 : 2 + n])
        if key in table:
            return key, table[key]
    return None


def upward_imports(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """The imports of `edges` (module -> (imported, line)) that run up `LAYERS` or, inside a
    part, up `SUBLAYERS`."""
    bad = []
    for module, targets in edges.items():
        for target, line in targets:
            src, dst = part(module), part(target)
            if dst == "litmt":
                continue
            if src != dst:
                if LAYERS[dst] >= LAYERS[src]:
                    bad.append(
                        f"{module}:{line} imports {target} ({src} {LAYERS[src]} -> {dst} {LAYERS[dst]})"
                    )
                continue
            here, there = sub_rank(module), sub_rank(target)
            if here and there and there[1] > here[1]:
                bad.append(f"{module}:{line} imports {target} ({src}: {here} -> {there})")
    return bad


def test_imports_run_down_the_layers() -> None:
    bad = upward_imports(graph())
    # `litmt` itself (the package __init__) is imported by every module, which is Python's doing
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_every_sublayer_key_names_a_module() -> None:
    missing = [
        f"litmt.{p}.{key}"
        for p, table in SUBLAYERS.items()
        for key in table
        if not exists(f"litmt.{p}.{key}")
    ]
    assert not missing, f"SUBLAYERS names what does not exist: {missing}"


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("litmt.deploy.export.base", "litmt.deploy.server.app"),  # an export importing the server
        ("litmt.deploy.engines.ct2", "litmt.deploy.loader"),
        (
            "litmt.decoding.search.beam",
            "litmt.decoding.translator",
        ),  # the search above the translator
        ("litmt.data.tokenization.tokenizer", "litmt.data.corpora.parallel"),
        ("litmt.models.mha", "litmt.decoding.config"),  # across parts
    ],
)
def test_a_planted_upward_import_is_caught(module: str, target: str) -> None:
    edges = graph()
    bad = upward_imports({**edges, module: [*edges[module], (target, 1)]})
    assert len(bad) == 1 and bad[0].startswith(f"{module}:1 imports {target}"), bad


def test_pure_torch_parts_import_no_framework() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if part(module_name(path)) in NO_FRAMEWORK:
            for target, line in imports(path):
                if target.split(".")[0] in FRAMEWORKS:
                    bad.append(f"{module_name(path)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph `edges`, or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_between_files() -> None:
    edges = {m: {t for t, _ in ts if t != m and t != "litmt"} for m, ts in graph().items()}
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
