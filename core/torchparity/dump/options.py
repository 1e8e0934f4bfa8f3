"""The dump's options live with capture (:mod:`torchparity.capture.options`, what to capture):
re-exported here under their old name."""

from ..capture.options import *  # noqa: F401,F403
from ..capture.options import (DumpOptions, _ranges, api_family, check_output_dir, compile_patterns,  # noqa: F401
                               from_msprobe, load_options_file, matches)
