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


_KEEP = ("children", "side", "status", "verdict")
#: numbers whose 0 means something (lightest band, no error) and must not be dropped as empty
_KEEP_ZERO = ("band", "precision_index", "worst_index", "error", "worst_error")


def _compact(data: dict) -> dict:
    """Smaller page data: empty fields dropped, call stacks stored once (nodes keep an index)."""
    stacks: dict[tuple[str, ...], int] = {}

    def stack_ref(frames: list[str]) -> int:
        return stacks.setdefault(tuple(frames), len(stacks))

    nodes = {}
    for k, n in data["nodes"].items():
        c = {f: v for f, v in n.items() if f in _KEEP or v not in (None, "", [], 0, False)
             or (f in _KEEP_ZERO and v is not None)}
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
.legend span{margin-right:8px}#matchbar{display:inline-flex;gap:4px;align-items:center}
.manual{font-style:italic}textarea{width:100%;height:90px;font-size:11px}pre{white-space:pre-wrap;font-size:11px;background:#f7f7f7;padding:4px}
</style></head><body>
<header><h1>torchparity graph</h1><span id="title" class="muted"></span>
<input id="q" type="search" placeholder="search node name" size="28">
<select id="filter"><option value="all">all nodes</option><option value="error">errors only</option>
<option value="warning">warnings + errors</option><option value="overflow">overflow</option>
<option value="unmatched">unmatched</option></select>
<select id="phase"><option value="">all phases</option><option>forward</option><option>backward</option>
<option>optimizer</option><option>recompute</option></select>
<button id="gorc">go to root cause</button><button id="collapse">collapse all</button>
<label>colour by <select id="colour"><option value="index">error size (precision index)</option>
<option value="verdict">verdict</option></select></label>
<span id="legend" class="legend"></span>
<span id="matchbar"><span id="picked" class="muted"></span><button id="domatch" disabled>match</button>
<button id="export">export matches</button></span>
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
const LEG = (G.legend || []).filter((b) => /^#[0-9A-Fa-f]{6}$/.test(b.colour));
const BOUNDS = LEG.slice(0, -1).map((b) => b.high);
const VERDICTS = [["pass", "pass"], ["warning", "warning"], ["error", "error"], ["overflow", "overflow"], ["unmatched", "unmatched"], ["none", "not judged"]];
const MATCHES = {modules: Object.assign({}, (G.matches || {}).modules || {}), records: Object.assign({}, (G.matches || {}).records || {})};
const pick = {device: null, bench: null};
function bandOf(x) { if (x === null || x === undefined || typeof x !== "number") return null; return BOUNDS.filter((b) => x >= b).length; }
function swatch(n) {
  const i = el("i", null, "sw");
  if ($("colour").value === "verdict" || G.mode !== "compare") { i.className = "sw s-" + n.status; return i; }
  if (n.status === "unmatched") i.className = "sw s-unmatched";
  else if (n.band === null || n.band === undefined || !LEG[n.band]) i.className = "sw s-none";
  else { i.style.background = LEG[n.band].colour; i.dataset.band = String(n.band); }
  return i;
}
function legendRender() {
  const L = $("legend"); L.replaceChildren();
  const item = (cls, colour, text) => { const s = el("span"), i = el("i", null, "sw " + cls); if (colour) i.style.background = colour; s.appendChild(i); s.appendChild(document.createTextNode(text)); L.appendChild(s); };
  if ($("colour").value === "verdict" || G.mode !== "compare") { for (const [k, t] of VERDICTS) item("s-" + k, null, t); return; }
  L.appendChild(el("span", "precision index:", "muted"));
  LEG.forEach((b, k) => item("", b.colour, fmt(b.low) + (k === LEG.length - 1 ? "–" + fmt(b.high) : "–<" + fmt(b.high))));
  item("s-unmatched", null, "unmatched"); item("s-none", null, "not compared");
}
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
  r.appendChild(swatch(n));
  r.appendChild(el("span", n.name, (n.root_cause ? "rc" : "") + (n.manual ? " manual" : "")));
  const extra = [];
  if (n.kind === "module" && n.module_class) extra.push(n.module_class);
  if (n.kind === "op") extra.push(n.phase || "");
  if (n.side !== "both" && G.mode === "compare") extra.push(n.side + " only");
  if (n.overflow) extra.push("overflow " + n.overflow);
  if (n.worst_error !== null && n.worst_error !== undefined) extra.push("err " + fmt(n.worst_error));
  if (n.worst_index !== null && n.worst_index !== undefined) extra.push("index " + fmt(n.worst_index));
  if (n.manual) extra.push("matched by hand");
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
  kv(t, "bench record", n.bench_name); kv(t, "precision index", n.precision_index); kv(t, "worst index below", n.worst_index); kv(t, "error", n.error); kv(t, "worst error below", n.worst_error); kv(t, "amplification", n.amplification);
  kv(t, "overflow", n.overflow); kv(t, "reason", n.reason); kv(t, "errors / warnings / unmatched below", (n.n_error || 0) + " / " + (n.n_warning || 0) + " / " + (n.n_unmatched || 0));
  if (n.root_cause) kv(t, "root cause", "yes: this op introduced the divergence");
  d.appendChild(t);
  if (G.mode === "compare" && n.side !== "both" && (n.kind === "op" || n.module)) {
    const b = el("button", "pick as " + n.side + " node for a manual match"); b.id = "pickbtn";
    b.onclick = () => { pick[n.side] = id; pickRender(); }; d.appendChild(b);
  }
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
function pickRender() {
  const name = (k) => (pick[k] ? N[pick[k]].name : "–");
  $("picked").textContent = "device: " + name("device") + " · bench: " + name("bench");
  const d = pick.device && N[pick.device], b = pick.bench && N[pick.bench];
  $("domatch").disabled = !(d && b && (d.kind === "op") === (b.kind === "op"));
}
function num(v) { if (v === "Infinity") return Infinity; if (v === "-Infinity") return -Infinity; return typeof v === "number" ? v : NaN; }
function rel(diff, ref) { const ad = Math.abs(diff), ar = Math.abs(ref); if (isNaN(diff) || isNaN(ref)) return NaN; return ar > 0 ? ad / ar : (ad > 0 ? Infinity : 0); }
function numel(s) { return Array.isArray(s) && s.every((x) => Number.isInteger(x)) ? s.reduce((a, x) => a * x, 1) : NaN; }
/* statistics of two hand-matched records, tensors paired by (io, arg): the same formulas as
   compare.metrics.stat_metrics for finite statistics; no verdict */
function manualMetrics(dev, bench) {
  const rows = [], bm = {};
  for (const t of bench || []) bm[t.io + "." + t.arg] = t;
  for (const t of dev || []) {
    const b = bm[t.io + "." + t.arg]; if (!b) continue;
    const r = {tensor: t.io + "." + t.arg, io: t.io, match: "manual", verdict: "none", device_dtype: t.dtype, bench_dtype: b.dtype, device_shape: t.shape, bench_shape: b.shape};
    const dd = {}, bb = {};
    for (const s of ["max", "min", "mean", "norm"]) { dd[s] = num(t[s]); bb[s] = num(b[s]); r[s + "_diff"] = dd[s] - bb[s]; r[s + "_rel_diff"] = rel(r[s + "_diff"], bb[s]); }
    const fin = (s) => isFinite(dd[s]) && isFinite(bb[s]);
    const fmax = (a, c) => (isNaN(a) ? c : isNaN(c) ? a : Math.max(a, c));
    const scale = fmax(fin("max") ? Math.abs(bb.max) : NaN, fin("min") ? Math.abs(bb.min) : NaN);
    const n = numel(t.shape), sq = Math.sqrt(isNaN(n) ? 1 : n);
    const parts = [fin("norm") ? rel(r.norm_diff, Math.abs(bb.norm)) : NaN,
      fin("mean") ? rel(Math.abs(r.mean_diff) * sq, fin("norm") ? Math.abs(bb.norm) : scale * sq) : NaN,
      rel(fmax(fin("max") ? Math.abs(r.max_diff) : NaN, fin("min") ? Math.abs(r.min_diff) : NaN), scale)].filter((x) => !isNaN(x));
    if (parts.length) r.error = Math.max(...parts);
    for (const s of ["nan", "inf"]) if (t[s]) r["device_" + s] = t[s];
    for (const k of Object.keys(r)) if (typeof r[k] === "number" && isNaN(r[k])) delete r[k];
    rows.push(r);
  }
  return rows;
}
function indexOf(rows) {
  const outs = rows.filter((r) => r.io === "output"); if (!outs.length) return null;
  if (outs.some((r) => (r.device_nan || 0) > (r.bench_nan || 0) || (r.device_inf || 0) > (r.bench_inf || 0))) return 1;
  const e = outs.map((r) => r.error).filter((x) => typeof x === "number"); if (!e.length) return null;
  const w = Math.max(...e.map(Math.abs)); return w > 1 ? 1 : w;
}
function reaggregate(id) {
  const n = N[id]; let w = (typeof n.precision_index === "number") ? n.precision_index : null, un = (n.side !== "both") ? 1 : 0;
  for (const c of n.children) { const [cw, cu] = reaggregate(c); if (cw !== null && (w === null || cw > w)) w = cw; un += cu; }
  n.worst_index = w; n.band = bandOf(w); n.n_unmatched = un;
  if (n.side === "both" && n.status === "unmatched") n.status = n.worst || "none";
  return [w, un];
}
function doMatch() {
  const d = N[pick.device], b = N[pick.bench];
  if (!d || !b) return;
  if (d.kind === "op") {
    MATCHES.records[d.name] = b.name;
    d.metrics = manualMetrics(d.tensors, b.tensors); d.precision_index = indexOf(d.metrics);
    d.bench_name = b.name; d.bench_tensors = b.tensors; d.manual = true; d.side = "both";
    d.reason = "matched by hand: statistics compared, not judged";
    const p = N[b.parent]; if (p) p.children = p.children.filter((c) => c !== pick.bench);
    delete N[pick.bench];
  } else {
    MATCHES.modules[d.module] = b.module; d.manual = true;
    d.reason = "matched by hand with " + b.module + ": export the matches and run torchparity graph --match-file to compare the records under it";
  }
  const did = pick.device; pick.device = pick.bench = null;
  reaggregate(G.root); pickRender(); reveal(did);
}
function matchesText() { return JSON.stringify({format: "torchparity-matches", version: 1, step: G.step, rank: G.rank, modules: MATCHES.modules, records: MATCHES.records}, null, 1); }
function exportMatches() {
  const text = matchesText(), d = $("info");
  d.appendChild(el("h4", "matches (save as matches.json, then: torchparity graph DUMP BENCH -o OUT --match-file matches.json)"));
  const ta = el("textarea"); ta.id = "matchjson"; ta.readOnly = true; ta.value = text; ta.textContent = text; d.appendChild(ta);
  try { const a = document.createElement("a"); a.href = URL.createObjectURL(new Blob([text], {type: "application/json"})); a.download = "matches.json"; if (a.click) a.click(); } catch (e) { /* no download API: copy from the text box */ }
}
$("domatch").onclick = doMatch; $("export").onclick = exportMatches;
$("colour").onchange = () => { legendRender(); render(); };
if (G.mode !== "compare") { $("colour").value = "verdict"; $("colour").disabled = true; $("matchbar").style.display = "none"; }
legendRender(); pickRender();
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
