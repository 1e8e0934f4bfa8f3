"""The zoo's modules (zoo_models, zoo_cells) import each other by name: put this folder on sys.path."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
