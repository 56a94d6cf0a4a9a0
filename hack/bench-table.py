#!/usr/bin/env python3
"""Markdown tables from the JSON reports of hack/bench-all.sh.

usage: hack/bench-table.py DIR

One table per scenario, a column per API budget (default 50/100, tuned 1000/2000), a row per
figure (BENCHMARKS.md says how each is measured). A run that failed shows as FAILED.
"""
import json
import pathlib
import sys

SCENARIOS = [
    ("local", "1,000 trivial local jobs (`run: true`), created as fast as the API takes them"),
    ("steady20", "600 trivial local jobs created at a steady 20/s"),
    ("steady35", "1,000 trivial local jobs created at a steady 35/s"),
    ("steady50", "1,000 trivial local jobs created at a steady 50/s"),
    ("local10k", "10,000 trivial local jobs"),
    ("pod", "1,000 Pods on 4 kwok nodes, 10 s each"),
    ("pod-churn", "400 Pods of 90 s on 4 kwok nodes; at 30 s and 60 s one node leaves for 60 s (its Pods are lost)"),
    ("priorities", "200 jobs of mixed priority under launch and run caps of 1"),
    ("pipeline", "1,000 three-task pipelines of `run: true`"),
    ("queues1", "1,000 trivial local jobs in one ManagedJobQueue"),
    ("queues10", "1,000 trivial local jobs spread over 10 ManagedJobQueues (what fairness costs)"),
    ("density", "5,000 jobs of `sleep` alive at once (run cap 5,000; see the text for how long each sleeps)"),
]


def ms(v):
    return "–" if v is None or v != v else (f"{v / 1000:.2f} s" if v >= 1000 else f"{v:.0f} ms")


def num(v, fmt="{:.2f}"):
    return "–" if v is None or v != v else fmt.format(v)


def phase(r, p):
    x = (r.get("status_latency_by_phase") or {}).get(p)
    if not x:
        return "–"
    return f"{ms(x['p50_ms'])} / {ms(x['p99_ms'])} ({x['count']})"


def cp(r):
    c = r.get("control_plane_cpu_seconds")
    if not c:
        return "–"
    rest = sum(v for k, v in c.items() if k not in ("kube-apiserver", "etcd"))
    return f"{c.get('kube-apiserver', 0):.0f} s / {c.get('etcd', 0):.0f} s / {rest:.0f} s"


ROWS = [
    ("jobs Succeeded", lambda r: f"{r['jobs'] - r['not_succeeded']} of {r['jobs']}"),
    ("end to end (jobs/s)", lambda r: f"{r['end_to_end_seconds']:.1f} s ({r['jobs_per_second']:.1f}/s)"),
    ("creating them took", lambda r: f"{r['create_seconds']:.1f} s"),
    ("drain lag (last create -> last terminal)", lambda r: num(r.get("drain_lag_seconds"), "{:.1f} s")),
    ("time to admit all", lambda r: num(r.get("time_to_admit_all_seconds"), "{:.1f} s")),
    ("create -> first status p50 / p99", lambda r: f"{ms(r['create_to_first_status_ms_p50'])} / {ms(r['create_to_first_status_ms_p99'])}"),
    ("status latency Submitted p50 / p99 (jobs that showed it)", lambda r: phase(r, "Submitted")),
    ("status latency Starting", lambda r: phase(r, "Starting")),
    ("status latency Running", lambda r: phase(r, "Running")),
    ("status latency terminal", lambda r: phase(r, "terminal")),
    ("slowest job, submit to finish", lambda r: f"{r['slowest_job']['seconds']:.1f} s" if r.get("slowest_job") else "–"),
    ("peak alive / launching seen from the API", lambda r: f"{r['peak_alive_seen']} / {r['peak_launching_seen']}"),
    ("status writes per job", lambda r: num(r.get("status_writes_per_job"))),
    ("Events per job (published by the end)", lambda r: num((r.get("api_requests_per_job") or {}).get("POST events"))),
    ("Pods created per job", lambda r: num((r.get("api_requests_per_job") or {}).get("POST pods"))),
    ("recoveries", lambda r: str(r.get("recoveries"))),
    ("nodes churned", lambda r: str(len(r.get("nodes_churned") or []))),
    ("priority inversions", lambda r: str(r.get("priority_order_inversions"))),
    ("operator RSS max", lambda r: num(r.get("operator_rss_mib_max"), "{:.1f} MiB")),
    ("operator CPU", lambda r: num(r.get("operator_cpu_seconds"), "{:.1f} s")),
    ("control plane CPU: API server / etcd / rest", lambda r: cp(r)),
    ("job controllers alive at the peak / their PSS sum", lambda r: f"{r['peak_job_controllers_sampled']} / {r['peak_job_controllers_pss_sum_mib']:.0f} MiB"),
    ("job controller USS p50 / p99", lambda r: f"{r['job_controller_uss_mib_p50']:.2f} / {r['job_controller_uss_mib_p99']:.2f} MiB"),
    ("job controller CPU per job", lambda r: num(r.get("job_controller_cpu_ms_per_job"), "{:.1f} ms")),
    ("scheduling pass in the run p50 / p99 (bucket bounds)", lambda r: f"≤ {num(r.get('scheduling_pass_ms_p50_in_run_at_most'), '{:.1f}')} / ≤ {num(r.get('scheduling_pass_ms_p99_in_run_at_most'), '{:.1f}')} ms"),
]


# Rows shown only for the scenarios whose name starts with this.
ONLY = {
    "Pods created per job": "pod",
    "recoveries": "pod",
    "nodes churned": "pod-churn",
    "priority inversions": "priorities",
}


def main():
    d = pathlib.Path(sys.argv[1])
    for name, title in SCENARIOS:
        reports = {}
        for budget in ("default", "tuned"):
            f = d / f"{name}-{budget}.json"
            if f.exists():
                reports[budget] = json.loads(f.read_text())
            elif (d / f"{name}-{budget}.log").exists():
                reports[budget] = None
        if not reports:
            continue
        commits = sorted({r["commit"] for r in reports.values() if r})
        print(f"#### {title} (commit {', '.join(commits)})\n")
        cols = list(reports)
        print("| figure | " + " | ".join(f"{b} ({'50/100' if b == 'default' else '1000/2000'})" for b in cols) + " |")
        print("|---|" + "---|" * len(cols))
        for label, f in ROWS:
            cells = []
            for b in cols:
                r = reports[b]
                if r is None:
                    cells.append("FAILED")
                    continue
                try:
                    cells.append(f(r))
                except (KeyError, TypeError):
                    cells.append("–")
            only = ONLY.get(label)
            if only and not name.startswith(only):
                continue
            if all(c in ("–", "None") for c in cells):
                continue
            print(f"| {label} | " + " | ".join(cells) + " |")
        print()
    for finished in (10000, 100000):
        for suffix in ("", "-queues100"):
            f = d / f"schedpass-{finished}{suffix}.log"
            if f.exists():
                print(f"- {f.read_text().strip()}")


if __name__ == "__main__":
    main()
