"""Cell sources of the example notebooks: ``NOTEBOOKS[name]`` is a list of ``(kind, source)``
with kind ``md`` or ``code``. ``examples/build_notebooks.py`` turns them into ``.ipynb`` files."""

from notebook_sources.draft_head_cells import CELLS as DRAFT_HEAD
from notebook_sources.quickstart_cells import CELLS as QUICKSTART
from notebook_sources.samplers_cells import CELLS as SAMPLERS
from notebook_sources.speedups_cells import CELLS as SPEEDUPS

NOTEBOOKS: dict[str, list[tuple[str, str]]] = {
    "01_quickstart": QUICKSTART,
    "02_speedups": SPEEDUPS,
    "03_samplers": SAMPLERS,
    "04_draft_head": DRAFT_HEAD,
}
