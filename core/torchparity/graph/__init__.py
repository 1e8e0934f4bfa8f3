"""Graph: rebuild the module/op hierarchy from dumps, compare two models node by node, colour by
error, filter and search, view it in a browser (one self-contained HTML file).

::

    from torchparity.graph import build_graph, compare_graphs, write_html, write_json
    g = compare_graphs("dumps/npu", "dumps/cpu", step=0, rank=0)
    g.node("layers.1.mlp").status        # 'error' (worst below it)
    write_html(g, "out/graph.html"); write_json(g, "out/graph.json")
"""

from __future__ import annotations

from .build import build_graph
from .compare import compare_graphs
from .html import render_html, write_html, write_json
from .model import Graph, Node

__all__ = ["Graph", "Node", "build_graph", "compare_graphs", "render_html", "write_html", "write_json"]
