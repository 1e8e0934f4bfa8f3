"""One report for a whole job from the shards' summaries: the first diverging (step, rank, op), a
per-rank table, what was not compared, and the workers' throughput and memory.

The first divergence is chosen exactly as the single-process compare chooses it among its pairs'
root causes: lowest step, then earliest op (execution index), then lowest rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .shards import COMPARED, NOT_COMPARED, ShardResult


@dataclass
class JobResult:
    """What a job comparison found (returned on the leader; other workers get ``leader=False``)."""

    summary: dict[str, Any]
    shards: list[ShardResult] = field(default_factory=list)
    leader: bool = True
    reports: list[Path] = field(default_factory=list)

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        return self.summary.get("first_divergence")

    @property
    def exit_code(self) -> int:
        """1 a divergence was found; 2 nothing diverged but some shards or tensors were not
        compared (the runs are not known to agree); 0 every shard compared and agreed."""
        if not self.leader:
            return int(self.summary.get("exit_code", 0))
        if self.summary.get("diverged"):
            return 1
        return 0 if self.summary.get("complete") else 2


def merge(results: list[ShardResult], messages: list[str], warnings: list[str], workers: list[dict[str, Any]],
          device_dump: str, bench_dump: str, elapsed_s: float) -> JobResult:
    """The job summary from every shard's result (compared or not)."""
    results = sorted(results, key=lambda x: (x.step, x.rank))
    done = [r for r in results if r.status == COMPARED]
    roots = [r.root_cause for r in done if r.root_cause]
    first = min(roots, key=lambda x: (x["step"], x["index"], x["rank"])) if roots else None
    seen: dict[str, int] = {}
    for r in done:
        for w in r.warnings:
            seen[w] = seen.get(w, 0) + 1
    per_rank: dict[int, dict[str, Any]] = {}
    for r in results:
        row = per_rank.setdefault(r.rank, {"rank": r.rank, "steps_compared": [], "steps_not_compared": [],
                                           "records_compared": 0, "first_divergence": None, "verdict": "agree"})
        if r.status != COMPARED:
            row["steps_not_compared"].append(r.step)
            continue
        row["steps_compared"].append(r.step)
        row["records_compared"] += r.device_records
        if r.root_cause and (row["first_divergence"] is None
                             or (r.root_cause["step"], r.root_cause["index"]) < (row["first_divergence"]["step"],
                                                                                  row["first_divergence"]["index"])):
            row["first_divergence"] = _fd(r.root_cause)
    for row in per_rank.values():
        rs = [r for r in results if r.rank == row["rank"]]
        verdicts = {r.verdict for r in rs}
        row["verdict"] = ("diverged" if "diverged" in verdicts else
                          "not compared" if verdicts == {NOT_COMPARED} else
                          "incomplete" if verdicts & {NOT_COMPARED, "incomplete"} else "agree")
    tot = {k: sum(getattr(r, k) for r in done) for k in ("device_records", "bench_records", "n_compared", "n_pass",
                                                          "n_warning", "n_error", "n_not_compared", "n_unchecked",
                                                          "n_damaged")}
    n_nc = sum(1 for r in results if r.status != COMPARED)
    diverged = any(r.diverged for r in done)
    summary = {
        "device_dump": device_dump, "bench_dump": bench_dump,
        "mode": next((r.mode for r in done if r.mode), None),
        "n_shards": len(results), "n_shards_compared": len(done), "n_shards_not_compared": n_nc,
        "n_shards_diverged": sum(1 for r in done if r.diverged),
        **tot,
        "steps": sorted({r.step for r in done}), "ranks": sorted({r.rank for r in done}),
        "diverged": diverged,
        "complete": n_nc == 0 and all(r.complete for r in done),
        "first_divergence": _fd(first) if first else None,
        "per_rank": [per_rank[k] for k in sorted(per_rank)],
        "not_compared": messages + [f"step{r.step}/rank{r.rank}: {r.reason}" for r in results
                                    if r.status != COMPARED and not r.reason.startswith(("only in the", "recorded fully"))],
        "warnings": warnings + [w + (f" (in {n} shards)" if n > 1 else "") for w, n in seen.items()],
        "workers": workers,
        "elapsed_s": round(elapsed_s, 3),
    }
    return JobResult(summary, results)


def _fd(rc: dict[str, Any]) -> dict[str, Any]:
    return {k: rc.get(k) for k in ("step", "rank", "op", "name", "module", "phase", "index", "score", "reason")}


def worker_stats(results: list[ShardResult]) -> list[dict[str, Any]]:
    """Per worker (host:pid): shards, records compared, busy seconds, records/s, peak RSS."""
    by: dict[str, dict[str, Any]] = {}
    for r in results:
        if not r.worker:
            continue
        w = by.setdefault(r.worker, {"worker": r.worker, "shards": 0, "records": 0, "busy_s": 0.0, "peak_rss_mb": 0.0})
        w["shards"] += 1
        w["records"] += r.device_records
        w["busy_s"] += r.elapsed_s
        w["peak_rss_mb"] = max(w["peak_rss_mb"], r.peak_rss_mb)
    for w in by.values():
        w["busy_s"] = round(w["busy_s"], 3)
        w["records_per_s"] = round(w["records"] / w["busy_s"]) if w["busy_s"] > 0 else 0
    return sorted(by.values(), key=lambda w: w["worker"])


# ------------------------------------------------------------------------------------------------
# text
# ------------------------------------------------------------------------------------------------


def _md(x: Any) -> str:
    """A value for a Markdown table cell: no pipe, backtick, angle bracket or line break survives."""
    s = "" if x is None else str(x)
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "&#124;")
            .replace("`", "&#96;").replace("\r", " ").replace("\n", " "))


def headline(s: dict[str, Any]) -> list[str]:
    """The console summary: counts, then the first divergence (or why there is none)."""
    lines = [f"compared {s['n_shards_compared']} of {s['n_shards']} (step, rank) shards "
             f"({s['device_records']} device records, {s['n_compared']} tensors, {s['mode'] or '-'} mode) over step(s) "
             f"{s['steps']} and {len(s['ranks'])} rank(s): {s['n_shards_diverged']} diverged, "
             f"{s['n_shards_not_compared']} NOT compared ({s['elapsed_s']:.2f} s)"]
    fd = s["first_divergence"]
    if fd:
        lines.append(f"first divergence: step {fd['step']} rank {fd['rank']} op {fd['op']} ({fd['name']} in "
                     f"{fd['module'] or '(top level)'}, {fd['phase']}, op #{fd['index']})")
        lines.append(f"  {fd['reason']}")
    elif s["diverged"]:
        lines.append("no op introduced a divergence, but some tensors are errors (see the per-shard reports)")
    elif not s["complete"]:
        lines.append("no divergence among the compared shards, but some were NOT compared: the runs are not known to agree")
    else:
        lines.append("no divergence: every shard agrees")
    return lines


def rank_table(s: dict[str, Any], limit: int | None = None) -> list[str]:
    """The per-rank table as Markdown (``limit``: at most that many rows, the ranks that need a
    look first; the others are counted)."""
    rows = s["per_rank"]
    if limit is not None and len(rows) > limit:
        bad = [r for r in rows if r["verdict"] != "agree"]
        shown = bad[:limit]
        rest = len(rows) - len(shown)
    else:
        shown, rest = rows, 0
    out = ["| rank | steps compared | records compared | first divergence | verdict |", "|---|---|---|---|---|"]
    for r in shown:
        fd = r["first_divergence"]
        steps = ", ".join(map(str, r["steps_compared"])) or "-"
        if r["steps_not_compared"]:
            steps += f" (not compared: {', '.join(map(str, r['steps_not_compared']))})"
        where = _md(f"step {fd['step']} {fd['op']} ({fd['name']})") if fd else "-"
        out.append(f"| {r['rank']} | {_md(steps)} | {r['records_compared']} | {where} | {_md(r['verdict'])} |")
    if rest:
        out.append(f"| ... | | | | {rest} more rank(s) agree |" if all(r["verdict"] == "agree" for r in rows
                                                                      if r not in shown)
                   else f"| ... | | | | {rest} more rank(s) |")
    return out


def write(job: JobResult, output_dir: str | Path) -> list[Path]:
    """``job_summary.json`` (everything, per shard too) and ``job_report.md`` (the headline, the
    per-rank table, what was not compared, the workers)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = job.summary
    js = out / "job_summary.json"
    js.write_text(json.dumps({**s, "shards": [r.to_dict() for r in job.shards]}, indent=1, default=str) + "\n",
                  encoding="utf-8")
    md = ["# torchparity job comparison", "", f"device `{_md(s['device_dump'])}` vs bench `{_md(s['bench_dump'])}`", ""]
    md += [_md(x) for x in headline(s)]
    md += ["", "## Per rank", ""] + rank_table(s)
    if s["not_compared"]:
        md += ["", "## Not compared", ""] + [f"- {_md(m)}" for m in s["not_compared"]]
    if s["warnings"]:
        md += ["", "## Warnings", ""] + [f"- {_md(w)}" for w in s["warnings"][:50]]
    if s["workers"]:
        md += ["", "## Workers", "", "| worker | shards | records | busy s | records/s | peak RSS MB |", "|---|---|---|---|---|---|"]
        md += [f"| {_md(w['worker'])} | {w['shards']} | {w['records']} | {w['busy_s']} | {w['records_per_s']} | "
               f"{w['peak_rss_mb']} |" for w in s["workers"]]
    rp = out / "job_report.md"
    rp.write_text("\n".join(md) + "\n", encoding="utf-8")
    return [js, rp]
