"""Write a graph as one self-contained HTML page (inline CSS/JS, data as JSON) and as graph.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .model import Graph

_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def embed_json(obj: object) -> str:
    """JSON safe inside a <script> element: no ``</script>``, ``<!--`` or line separators survive."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    for k, v in _ESCAPES.items():
        text = text.replace(k, v)
    return text


def write_json(graph: Graph, path: str | os.PathLike[str]) -> Path:
    """graph.json: strict JSON (NaN -> null, Inf -> "Infinity") for tools."""
    p = Path(path)
    p.write_text(json.dumps(graph.to_dict(), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return p


def _compact(data: dict) -> dict:
    """Smaller page data: empty fields dropped, call stacks stored once (nodes keep an index)."""
    stacks: dict[tuple[str, ...], int] = {}

    def stack_ref(frames: list[str]) -> int:
        return stacks.setdefault(tuple(frames), len(stacks))

    nodes = {}
    for k, n in data["nodes"].items():
        c = {f: v for f, v in n.items() if f in ("children", "side", "status", "verdict") or v not in (None, "", [], 0, False)}
        if n.get("stack"):
            c["stack"] = stack_ref(n["stack"])
        for call in c.get("calls", []):
            if call.get("stack"):
                call["stack"] = stack_ref(call["stack"])
        nodes[k] = c
    out = dict(data)
    out["nodes"] = nodes
    out["stacks"] = [list(s) for s in stacks]
    return out


def render_html(graph: Graph) -> str:
    """The page as a string."""
    return _PAGE.replace("/*DATA*/", embed_json(_compact(graph.to_dict())))


def write_html(graph: Graph, path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    p.write_text(render_html(graph), encoding="utf-8")
    return p


_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>torchparity graph</title>
<style>
body{font:13px/1.35 system-ui,sans-serif;margin:0;display:flex;flex-direction:column;height:100vh;color:#222}
header{padding:6px 10px;border-bottom:1px solid #ccc;display:flex;gap:8px;flex-wrap:wrap;align-items:center;background:#f7f7f7}
header h1{font-size:15px;margin:0 8px 0 0}
main{flex:1;display:flex;min-height:0}
#tree{flex:1;overflow:auto;padding:6px;border-right:1px solid #ccc;font-family:ui-monospace,monospace;font-size:12px}
#details{width:46%;overflow:auto;padding:8px}
.row{white-space:nowrap;cursor:pointer;padding:1px 2px;border-radius:3px}
.row:hover{background:#eef}.row.sel{background:#cde}
.tog{display:inline-block;width:14px;color:#666}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:middle;border:1px solid #0003}
.s-pass{background:#5cb85c}.s-warning{background:#f0ad4e}.s-error{background:#d9534f}.s-overflow{background:#7b1fa2}
.s-unmatched{background:#aaa}.s-none{background:#fff}
.muted{color:#888}.rc{font-weight:bold;text-decoration:underline}
.kids{margin-left:16px}
table{border-collapse:collapse;margin:4px 0 10px}td,th{border:1px solid #ddd;padding:2px 5px;text-align:left;font-size:12px;vertical-align:top}
th{background:#f2f2f2}#results{max-height:160px;overflow:auto;font-size:12px}
.legend span{margin-right:8px}pre{white-space:pre-wrap;font-size:11px;background:#f7f7f7;padding:4px}
</style></head><body>
<header><h1>torchparity graph</h1><span id="title" class="muted"></span>
<input id="q" type="search" placeholder="search node name" size="28">
<select id="filter"><option value="all">all nodes</option><option value="error">errors only</option>
<option value="warning">warnings + errors</option><option value="overflow">overflow</option>
<option value="unmatched">unmatched</option></select>
<select id="phase"><option value="">all phases</option><option>forward</option><option>backward</option>
<option>optimizer</option><option>recompute</option></select>
<button id="gorc">go to root cause</button><button id="collapse">collapse all</button>
<span class="legend"><span><i class="sw s-pass"></i>pass</span><span><i class="sw s-warning"></i>warning</span>
<span><i class="sw s-error"></i>error</span><span><i class="sw s-overflow"></i>overflow</span>
<span><i class="sw s-unmatched"></i>unmatched</span><span><i class="sw s-none"></i>not judged</span></span>
</header>
<main><div id="tree"></div><div id="details"><div id="results"></div><div id="info"></div></div></main>
<script type="application/json" id="graph-data">/*DATA*/</script>
<script>
"use strict";
const G = JSON.parse(document.getElementById("graph-data").textContent);
const N = G.nodes, open = new Set([G.root]);
let selected = null;
const $ = (id) => document.getElementById(id);
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined && text !== null) e.textContent = String(text); if (cls) e.className = cls; return e; }
function fmt(v) { if (v === null || v === undefined) return ""; if (typeof v === "number") return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : String(+v.toPrecision(6)); if (Array.isArray(v)) return "[" + v.map(fmt).join(", ") + "]"; if (typeof v === "object") return JSON.stringify(v); return String(v); }
const RANK = {none: 0, pass: 1, warning: 2, error: 3, overflow: 4};
function own(n, f, ph) {
  if (ph && n.kind === "op" && n.phase !== ph) return false;
  if (ph && n.kind === "module") return false;
  if (f === "all") return true;
  if (f === "error") return n.verdict === "error";
  if (f === "warning") return n.verdict === "error" || n.verdict === "warning";
  if (f === "overflow") return !!n.overflow;
  if (f === "unmatched") return n.side !== "both";
  return true;
}
let visible = null;
function computeVisible() {
  const f = $("filter").value, ph = $("phase").value;
  visible = new Set();
  if (f === "all" && !ph) return (visible = null);
  const walk = (id) => { const n = N[id]; let v = own(n, f, ph); for (const c of n.children) if (walk(c)) v = true; if (v) visible.add(id); return v; };
  walk(G.root);
}
function label(n) {
  const r = el("span");
  r.appendChild(el("i", null, "sw s-" + n.status));
  r.appendChild(el("span", n.name, n.root_cause ? "rc" : ""));
  const extra = [];
  if (n.kind === "module" && n.module_class) extra.push(n.module_class);
  if (n.kind === "op") extra.push(n.phase || "");
  if (n.side !== "both" && G.mode === "compare") extra.push(n.side + " only");
  if (n.overflow) extra.push("overflow " + n.overflow);
  if (n.worst_error !== null && n.worst_error !== undefined) extra.push("err " + fmt(n.worst_error));
  if (n.root_cause) extra.push("ROOT CAUSE");
  r.appendChild(el("span", "  " + extra.join(" · "), "muted"));
  return r;
}
function renderNode(id) {
  const n = N[id], box = el("div");
  const row = el("div", null, "row" + (selected === id ? " sel" : "")); row.dataset.id = id;
  const kids = n.children.filter((c) => !visible || visible.has(c));
  row.appendChild(el("span", kids.length ? (open.has(id) ? "▾" : "▸") : "", "tog"));
  row.appendChild(label(n));
  row.onclick = () => { if (kids.length) { open.has(id) ? open.delete(id) : open.add(id); } select(id); };
  box.appendChild(row);
  if (open.has(id) && kids.length) { const k = el("div", null, "kids"); for (const c of kids) k.appendChild(renderNode(c)); box.appendChild(k); }
  return box;
}
function render() { computeVisible(); const t = $("tree"); t.replaceChildren(renderNode(G.root)); const s = t.querySelector(".row.sel"); if (s) s.scrollIntoView({block: "nearest"}); }
function reveal(id) { let p = N[id].parent; while (p !== null && p !== undefined) { open.add(p); p = N[p].parent; } if (visible && !visible.has(id)) { $("filter").value = "all"; $("phase").value = ""; } selected = id; render(); showDetails(id); }
function select(id) { selected = id; render(); showDetails(id); }
function kv(tbl, k, v) { if (v === null || v === undefined || v === "") return; const tr = el("tr"); tr.appendChild(el("th", k)); tr.appendChild(el("td", fmt(v))); tbl.appendChild(tr); }
function table(rows, cols) { const t = el("table"), h = el("tr"); for (const c of cols) h.appendChild(el("th", c)); t.appendChild(h);
  for (const r of rows) { const tr = el("tr"); for (const c of cols) tr.appendChild(el("td", fmt(r[c]))); t.appendChild(tr); } return t; }
const TCOLS = ["io", "arg", "dtype", "shape", "max", "min", "mean", "norm", "nan", "inf", "value"];
const MCOLS = ["tensor", "verdict", "error", "amplification", "device_dtype", "bench_dtype", "device_shape", "bench_shape", "max_rel_diff", "min_rel_diff", "mean_rel_diff", "norm_rel_diff", "cosine", "max_abs_err", "max_rel_err", "one_thousandth_ratio", "reason"];
function usedCols(rows, cols) { return cols.filter((c) => rows.some((r) => r[c] !== undefined && r[c] !== null)); }
function showDetails(id) {
  const n = N[id], d = $("info"); d.replaceChildren();
  d.appendChild(el("h3", n.name));
  const t = el("table");
  kv(t, "kind", n.kind); kv(t, "status", n.status); kv(t, "own verdict", n.verdict); kv(t, "op", n.op); kv(t, "module", n.module || "(top level)");
  kv(t, "module class", n.module_class); kv(t, "phase", n.phase); kv(t, "level", n.level); kv(t, "present", n.side === "both" ? "both sides" : n.side + " only");
  kv(t, "bench record", n.bench_name); kv(t, "error", n.error); kv(t, "worst error below", n.worst_error); kv(t, "amplification", n.amplification);
  kv(t, "overflow", n.overflow); kv(t, "reason", n.reason); kv(t, "errors / warnings / unmatched below", (n.n_error || 0) + " / " + (n.n_warning || 0) + " / " + (n.n_unmatched || 0));
  if (n.root_cause) kv(t, "root cause", "yes: this op introduced the divergence");
  d.appendChild(t);
  const tens = (label, rows) => { if (rows && rows.length) { d.appendChild(el("h4", label)); d.appendChild(table(rows, usedCols(rows, TCOLS))); } };
  tens(G.mode === "compare" ? "device tensors" : "tensors", n.tensors);
  tens("bench tensors", n.bench_tensors);
  if (n.metrics && n.metrics.length) { d.appendChild(el("h4", "metrics")); d.appendChild(table(n.metrics, usedCols(n.metrics, MCOLS))); }
  for (const c of n.calls || []) {
    d.appendChild(el("h4", "module call " + c.name + (c.verdict ? " — " + c.verdict : "")));
    if (c.metrics && c.metrics.length) d.appendChild(table(c.metrics, usedCols(c.metrics, MCOLS)));
    else if (c.tensors && c.tensors.length) d.appendChild(table(c.tensors, usedCols(c.tensors, TCOLS)));
  }
  if (n.stack !== undefined && G.stacks[n.stack]) { d.appendChild(el("h4", "stack (innermost last)")); d.appendChild(el("pre", G.stacks[n.stack].join("\n"))); }
}
function search() {
  const q = $("q").value.trim().toLowerCase(), box = $("results"); box.replaceChildren();
  if (q.length < 2) return;
  const hits = Object.keys(N).filter((k) => N[k].name.toLowerCase().includes(q));
  box.appendChild(el("div", hits.length + " match(es)" + (hits.length > 200 ? ", first 200 shown" : ""), "muted"));
  for (const k of hits.slice(0, 200)) { const r = el("div", null, "row"); r.appendChild(label(N[k])); r.onclick = () => reveal(k); box.appendChild(r); }
}
$("q").addEventListener("input", search);
$("filter").onchange = render; $("phase").onchange = render;
$("gorc").onclick = () => { if (G.root_cause) reveal(G.root_cause); else { $("info").replaceChildren(el("p", G.mode === "compare" ? "No root cause: the runs agree." : "Single-dump graph: no comparison, no root cause.")); } };
$("gorc").disabled = !G.root_cause;
$("collapse").onclick = () => { open.clear(); open.add(G.root); render(); };
$("title").textContent = (G.mode === "compare" ? "compare " + G.device_dump + " vs " + G.bench_dump : "build " + G.device_dump) + " — step " + G.step + " rank " + G.rank;
render(); showDetails(G.root);
if (G.root_cause) reveal(G.root_cause);
</script></body></html>
"""
