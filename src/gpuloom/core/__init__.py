"""Plain data: clusters, jobs, allocations and plans.  No I/O, no global state."""

from .cluster import Cluster, ClusterError, Node, load_cluster_file, parse_cluster
from .job import ActiveJobs, Job, JobError, JobSpec, JobStatus
from .plan import Action, ActionKind, Allocation, Part, Plan, PlanError, check_plan, diff

__all__ = [
    "Action", "ActionKind", "ActiveJobs", "Allocation", "Cluster", "ClusterError", "Job", "JobError",
    "JobSpec", "JobStatus", "Node", "Part", "Plan", "PlanError", "check_plan", "diff",
    "load_cluster_file", "parse_cluster",
]
