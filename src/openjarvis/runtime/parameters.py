"""A local model's parameter count, from its GGUF header, for the run record (`ipw show`).

The count is summed over the header's tensor shapes, as the catalog lists it.
"""

from pathlib import Path

from openjarvis.errors import UserError
from openjarvis.runtime.gguf import read_gguf_header

__all__ = ["model_parameters"]


def model_parameters(path: Path) -> int | None:
    """The parameter count of the GGUF at `path`; None when its header cannot be read.

    A run records why a header was unreadable in its model_kind_evidence (read_model_kind reads
    the same header), so None here loses no reason.
    """
    try:
        return read_gguf_header(path).parameter_count
    except UserError:
        return None
