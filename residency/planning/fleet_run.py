"""`residency plan --replicas N` / `--replica-server URL ...` end to end: each replica's
capacity (the profile's N times, or each server read live), one attribution of the log, the
fleet's prefixes and their placement (fleet.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from residency.capacity.report import CapacityReport, build_capacity_report
from residency.index import BuildProgress, open_index
from residency.planning.fleet import plan_fleet
from residency.planning.plan_model import CapacitySnapshot, ResidencyPlan
from residency.planning.run import (
    PlanJob,
    choose_sample,
    encoder_for,
    plan_from_log,
    read_log,
    sample_index,
    snapshot,
)


def replica_reports(job: PlanJob, replicas: int, servers: Sequence[str]) -> list[CapacityReport]:
    """Every replica's capacity: each of `servers` read live, else the request's `replicas`
    times (identical replicas of one profile or server)."""
    if servers:
        requests = [job.capacity.model_copy(update={"server": url}) for url in servers]
        return [build_capacity_report(r) for r in requests]
    one = build_capacity_report(job.capacity)
    return [one] * replicas


def run_fleet_plan(
    job: PlanJob,
    replicas: int,
    servers: Sequence[str] = (),
    progress: BuildProgress | None = None,
) -> tuple[CapacityReport, ResidencyPlan]:
    """The fleet's plan for `job` (not yet written) and the first replica's capacity report."""
    reports = replica_reports(job, replicas, servers)
    if servers:  # the first replica's tokenizer counts and hashes the prefixes
        capacity = job.capacity.model_copy(update={"server": servers[0]})
        job = dataclasses.replace(job, capacity=capacity)
    corpus = None
    if job.index_dir is None:
        corpus = job.sample or choose_sample(job)
        index = sample_index(progress, corpus, job.backend)
    else:
        index = open_index(job.index_dir, backend=job.backend)
    log, files = read_log(job, corpus)
    encoder = encoder_for(job, index, job.index_dir is None)

    def plan_once(capacity: CapacitySnapshot, count: int | None) -> ResidencyPlan:
        settings = job.settings.model_copy(update={"prefixes": count})
        return plan_from_log(index, log, files, capacity, encoder, settings, job.pins, job.excludes)

    snapshots = [snapshot(r) for r in reports]
    settings = job.settings
    return reports[0], plan_fleet(plan_once, snapshots, settings.prefixes, settings.shared_tokens)
