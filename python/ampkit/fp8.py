"""fp8 training for Python: ``convert(model, recipe=...)`` swaps nn.Linear for ``Linear``, which
multiplies in fp8 with torch._scaled_mm, its scales chosen by a recipe named as a plugin
(docs/fp8.md). Imported when first named (``ampkit.fp8``), not by ``import ampkit``."""

from __future__ import annotations

from ._fp8_linear import Linear, convert, update

__all__ = ["Linear", "convert", "update"]
