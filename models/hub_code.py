"""The model code of an exported checkpoint, self-contained: what ``trust_remote_code`` runs from a Hub repo.

``save_pretrained`` copies ``modeling_hybrid.py`` and ``configuration_hybrid.py`` beside the weights, but the
modeling file imports its layers from the installed ``deltamatch`` package, which users of a Hub repo do not have.
:func:`write_model_code` writes the folder's code as transformers expects it of a Hub repo instead: the two files plus
every layer module (``attention.py``, ``gdn.py``, ...) as flat siblings, the modeling file's
``deltamatch.models.layers.X`` imports rewritten to ``.X``. The layers import each other relatively already, and their
optional imports (deltamatch's FP8 kernels, fla, Triton) sit in ``try`` blocks, which transformers' import check skips;
the layers fall back to exact attention and the pure-torch Gated DeltaNet without them. The result is checked: a
file of the bundle that still imports deltamatch outside a ``try`` block is an error, never a broken upload.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from deltamatch.atomic import write_text

MODELS = Path(__file__).resolve().parent
LAYERS = MODELS / "layers"
_LAYER_IMPORT = re.compile(r"^(\s*)from deltamatch\.models\.layers\.(\w+) import ", re.M)


def bundle_sources() -> dict[str, str]:
    """File name -> source text of the self-contained model code."""
    modeling = _LAYER_IMPORT.sub(r"\1from .\2 import ", (MODELS / "modeling_hybrid.py").read_text(encoding="utf-8"))
    files = {"configuration_hybrid.py": (MODELS / "configuration_hybrid.py").read_text(encoding="utf-8"),
             "modeling_hybrid.py": modeling}
    for path in sorted(LAYERS.glob("*.py")):
        if path.name != "__init__.py":
            files[path.name] = path.read_text(encoding="utf-8")
    for name, text in files.items():
        if outside_try_imports(text, "deltamatch"):
            raise ValueError(f"model code {name} still imports deltamatch outside a try block; the Hub copy would "
                             "not load without the package")
    return files


def outside_try_imports(source: str, package: str) -> list[int]:
    """Line numbers of absolute imports of ``package`` that are not inside a ``try`` block (transformers requires
    every such import to be installed before it runs remote code)."""
    lines: list[int] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Try):
            return
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == package for a in node.names):
            lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == package:
            lines.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return lines


def write_model_code(folder: str | Path) -> list[Path]:
    """Write the self-contained model code into ``folder`` (each file atomically; replaces hard links rather than
    writing through them, so a published folder never changes the checkpoint it was linked from)."""
    written = []
    for name, text in bundle_sources().items():
        path = Path(folder) / name
        write_text(path, text)
        written.append(path)
    return written
