"""neuron-plan's report: the job's figures from its planned ranks (`build_report`), as text (`format_report`) and as a
Perfetto trace (`write_trace`)."""

from __future__ import annotations

import json
from typing import Any

from neuron_spec.hardware import INSTANCE_TYPES, TARGETS

from .plan_pipeline import combine

__all__ = ["build_report", "format_report", "write_trace"]

_REPORT_ORDER = ("world_size", "step_seconds", "compute_seconds", "communication_seconds",
                 "exposed_communication_seconds", "flops_per_step", "mfu", "peak_hbm_bytes", "peak_allocated_bytes",
                 "hbm_capacity_bytes", "fits", "tokens_per_second", "cost_per_step_usd", "cost_per_million_tokens_usd",
                 "batch_size", "output_tokens", "ttft_seconds", "tpot_seconds", "output_tokens_per_second",
                 "kv_cache_bytes", "cost_per_million_output_tokens_usd")


def build_report(plans: list[dict[str, Any]], *, instance: str, nodes: int, tokens_per_step: int | None,
                 price_per_hour: float | None) -> dict[str, Any]:
    """The job's report from its planned ranks: the slowest rank's step, the largest per-core HBM peak (a pipeline's
    schedule laid out first from every stage's costs)."""
    plans = combine(plans)
    slowest = max(plans, key=lambda p: p["step_seconds"])
    found = INSTANCE_TYPES[instance]
    target = TARGETS[found.target]
    peak_flops = target.tensor_tflops_bf16 * 1e12 * target.default_lnc  # one logical core
    step = slowest["step_seconds"]
    report: dict[str, Any] = {
        "instance": instance, "nodes": nodes, "world_size": slowest["world_size"],
        "ranks_planned": [p["rank"] for p in plans], "steps_observed": slowest["steps_observed"],
        "step_seconds": step, "compute_seconds": slowest["compute_seconds"],
        "communication_seconds": slowest["communication_seconds"],
        "exposed_communication_seconds": slowest["exposed_communication_seconds"],
        "flops_per_step": slowest["flops_per_step"],
        "mfu": slowest["flops_per_step"] / (step * peak_flops) if step > 0 else 0.0,
        "peak_hbm_bytes": max(p["peak_hbm_bytes"] for p in plans),
        "peak_allocated_bytes": max(p["peak_allocated_bytes"] for p in plans),
        "hbm_capacity_bytes": slowest["hbm_capacity_bytes"],
        "fits": all(p["fits"] for p in plans),
        "breakdown": dict(sorted(slowest["breakdown"].items(), key=lambda item: -item[1])),
        # what the plan assumed where values steer the run: `plan_values`' and the rules that answered `generate`'s reads
        "assumptions": sorted({a for p in plans for a in p.get("assumptions", [])}
                              | {rule for p in plans for rule in (p.get("serving") or {}).get("assumed", [])}),
    }
    if slowest.get("pipeline"):
        pipe = slowest["pipeline"]
        report["pipeline"] = {key: pipe[key] for key in ("schedule", "num_stages", "n_microbatches", "pipeline_rank",
                                                         "bubble_fraction")}
        report["pipeline"]["stages"] = sorted({c["stage_index"]: c for p in plans for c in p["pipeline"]["stages"]}
                                              .values(), key=lambda c: c["stage_index"])
    oom = next((p for p in plans if p["oom"] is not None), None)
    if oom is not None:
        report["oom"] = {"rank": oom["rank"], **oom["oom"]}
    if tokens_per_step:
        report["tokens_per_second"] = tokens_per_step / step if step > 0 else 0.0
    if price_per_hour is None and found.usd_per_hour is not None:
        price_per_hour = found.price_per_hour()
    if price_per_hour is not None:
        report["price_per_hour_usd"] = price_per_hour
        report["cost_per_step_usd"] = step * price_per_hour * nodes / 3600
        if tokens_per_step:
            report["cost_per_million_tokens_usd"] = report["cost_per_step_usd"] / tokens_per_step * 1e6
    report.update(_serving(plans, price_per_hour, nodes))
    return report


def _serving(plans: list[dict[str, Any]], price_per_hour: float | None, nodes: int) -> dict[str, Any]:
    """A generating script's figures (`plan_generate`): the slowest planned rank's time to first token and per
    output token (the ranks of a tensor-parallel model wait for each other), the steady decode's output tokens a
    second of the whole batch (batch / time per token), the largest KV cache a core (the rules that answered reads
    are among the report's `assumptions`)."""
    served = [p["serving"] for p in plans if p.get("serving")]
    if not served:
        return {}
    tpot = max(s["tpot_seconds"] for s in served)
    out = {"batch_size": served[0]["batch_size"], "output_tokens": served[0]["output_tokens"],
           "ttft_seconds": max(s["ttft_seconds"] for s in served), "tpot_seconds": tpot,
           "output_tokens_per_second": served[0]["batch_size"] / tpot if tpot > 0 else 0.0,
           "kv_cache_bytes": max(s["kv_cache_bytes"] for s in served)}
    if price_per_hour is not None and out["output_tokens_per_second"] > 0:
        out["cost_per_million_output_tokens_usd"] = price_per_hour * nodes / 3600 / out["output_tokens_per_second"] * 1e6
    return out


def format_report(report: dict[str, Any], breakdown: bool = False) -> str:
    """The report as text, one key a line, bytes in GiB; with `breakdown`, the step split by what it went to."""
    lines = [f"neuron-plan: {report['nodes']} x {report['instance']}, world size {report['world_size']} "
             f"(ranks planned: {report['ranks_planned']})"]
    for key in _REPORT_ORDER:
        if key not in report:
            continue
        value = report[key]
        if key.endswith("_bytes"):
            text = f"{value / 2**30:.2f} GiB"
        elif isinstance(value, float):
            text = f"{value:.6g}"
        else:
            text = str(value)
        lines.append(f"  {key:32s} {text}")
    lines += [f"  assumed: {assumption}" for assumption in report.get("assumptions", [])]
    if breakdown:
        step = report["step_seconds"]
        lines.append("  breakdown of the step (slowest planned rank):")
        lines += [f"    {part:32s} {seconds * 1e3:12.3f} ms {seconds / step if step else 0.0:7.1%}"
                  for part, seconds in report["breakdown"].items()]
    if "pipeline" in report:
        pipe = report["pipeline"]
        lines.append(f"  pipeline: {pipe['schedule']}, {pipe['num_stages']} stages, {pipe['n_microbatches']} "
                     f"micro-batches, bubble {pipe['bubble_fraction']:.1%} on pipeline rank {pipe['pipeline_rank']}")
        lines += [f"    stage {c['stage_index']:3d}: forward {c['forward_seconds'] * 1e3:9.3f} ms, backward "
                  f"{c['backward_seconds'] * 1e3:9.3f} ms, activations {c['activation_bytes'] / 2**30:7.2f} GiB a "
                  "micro-batch" for c in pipe["stages"]]
    if "oom" in report:
        oom = report["oom"]
        lines.append(f"  out of HBM on rank {oom['rank']} at {oom['op']} in {oom['module']}, called at {oom['code']}; "
                     "largest live tensors:")
        lines += [f"    {e['module']:60s} {e['bytes'] / 2**30:8.2f} GiB in {e['tensors']} tensors"
                  for e in oom["largest_live_tensors_by_module"]]
    return "\n".join(lines)


def write_trace(path: str, plans: list[dict[str, Any]]) -> None:
    """A Perfetto (Chrome JSON) trace of the planned step: a process per planned rank, a thread per stream."""
    events = []
    for plan in plans:
        events.append({"ph": "M", "name": "process_name", "pid": plan["rank"], "args": {"name": f"rank {plan['rank']}"}})
        for name, stream, start, end in plan["lanes"]:
            events.append({"ph": "X", "name": name, "pid": plan["rank"], "tid": stream, "ts": start * 1e6,
                           "dur": (end - start) * 1e6})
        if plan.get("schedule_lanes"):  # a pipeline stage: the whole schedule on a lane of its own
            events.append({"ph": "M", "name": "thread_name", "pid": plan["rank"], "tid": "schedule",
                           "args": {"name": "pipeline schedule"}})
            events += [{"ph": "X", "name": name, "pid": plan["rank"], "tid": "schedule", "ts": start * 1e6,
                        "dur": (end - start) * 1e6} for name, start, end in plan["schedule_lanes"]]
    with open(path, "w") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)
