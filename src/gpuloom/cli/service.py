"""The service face of the CLI: ``gpuloom serve`` and Slurm-like clients.

(Over 500 lines: ``serve``'s options and the client commands it answers belong together.)

=====================  ==========  ============================================
gpuloom                Slurm       what
=====================  ==========  ============================================
``serve``              slurmctld   run the scheduler service (API + loop + dashboard)
``cancel ID...``       scancel     cancel jobs (owner or admin)
``nodes``              sinfo       nodes with used/total GPUs, cores, memory
``token create USER``  (sacctmgr)  a token for a user (admin; ``--expires 30d``)
``token list|revoke``  (sacctmgr)  tokens by id; revoke one
``queues``             (sshare)    usage vs quota per queue; admin changes
                                   (:mod:`gpuloom.cli.queues`)

``submit``, ``queue``, ``show``, ``history`` and ``logs`` are in :mod:`.jobs`.
=====================  ==========  ============================================

Clients find the server and token from ``--url``/``--token``, else
``GPULOOM_URL``/``GPULOOM_TOKEN``, else the state directory
(``--state-dir``, ``GPULOOM_STATE_DIR``, default ``~/.gpuloom``) where
``serve`` writes ``server.json`` and ``admin.token``, else a root server's
socket ``/run/gpuloom/PORT.sock``; they send a token only to a server running
as a trusted account (:mod:`gpuloom.runtime.api.connect`).  Every command takes
``--json``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape

from ..core.registry import STAGE_DEFAULTS
from ..runtime.exec.cgroups import DEFAULT_PIDS_MAX
from . import app
from .common import SafeTable as Table
from .common import cell, check_policies, console, err_console, model_options, stack_params, user_errors
from .queues import served_queue_stage

token_app = typer.Typer(help="Manage API tokens (admin).", no_args_is_help=True)
app.add_typer(token_app, name="token")

DEFAULT_PORT = 8642

StateDirOpt = Annotated[
    Path | None, typer.Option("--state-dir", envvar="GPULOOM_STATE_DIR", help="State directory (default ~/.gpuloom).")
]
UrlOpt = Annotated[str | None, typer.Option("--url", envvar="GPULOOM_URL", help="Server URL.")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="GPULOOM_TOKEN", help="API token.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def state_dir_path(p: Path | None) -> Path:
    """The state directory, absolute (a relative one is taken from where the command runs, once)."""
    return Path(os.path.abspath(p if p is not None else Path.home() / ".gpuloom"))


# ---------------------------------------------------------------------------------------------
@app.command()
@model_options
def serve(
    model_opts: dict,
    host: Annotated[str, typer.Option(help="Address to bind (loopback unless told otherwise).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="GPULOOM_PORT", help="Port (0 = any free port).")] = DEFAULT_PORT,
    db: Annotated[str | None, typer.Option(help="SQLAlchemy URL (default sqlite file in the state dir).")] = None,
    state_dir: StateDirOpt = None,
    gpus: Annotated[int | None, typer.Option(help="Declared inventory: one node with N GPUs (this machine).")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", "-C", help="Declared inventory: NODESxGPUS or a cluster file.")] = None,
    cpus_per_node: Annotated[int | None, typer.Option(help="Cores per node for a declared inventory.")] = None,
    mem_gb_per_node: Annotated[float | None, typer.Option(help="Memory per node (GB) for a declared inventory.")] = None,
    order: Annotated[str, typer.Option(help="Order policy (same names as simulate).")] = STAGE_DEFAULTS["order"],
    group: Annotated[str, typer.Option(help="Group policy.")] = STAGE_DEFAULTS["group"],
    size: Annotated[str, typer.Option(help="Size policy.")] = STAGE_DEFAULTS["size"],
    place: Annotated[str, typer.Option(help="Place policy.")] = STAGE_DEFAULTS["place"],
    non_preemptive: Annotated[bool, typer.Option("--non-preemptive", help="Never preempt a running job.")] = False,
    queue_policy: Annotated[str | None, typer.Option(
        "--queue-policy", help="Queue stage: none, quota, drf, fairshare (default: quota with --queues, else none).")] = None,
    reserve_depth: Annotated[int, typer.Option(
        "--reserve-depth", help="Backfill guarantee: reservations (and estimated starts) for the first N waiting "
                                "jobs; 0 turns it off.")] = 8,
    queues: Annotated[Path | None, typer.Option(
        "--queues", help="Queue tree (TOML); replaces the stored one. Without it the stored tree is used.")] = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-P", help="Policy parameter or model option name=value.")] = None,
    round_s: Annotated[float, typer.Option("--round", help="Seconds between scheduling rounds.")] = 5.0,
    grace: Annotated[float, typer.Option(help="Seconds a stopped job gets to checkpoint before SIGKILL.")] = 10.0,
    launch_timeout: Annotated[float, typer.Option(help="Seconds a job without progress lines counts as launching.")] = 60.0,
    seed: Annotated[int, typer.Option(help="Seed for random placement.")] = 0,
    profile: Annotated[bool | None, typer.Option(
        "--profile/--no-profile",
        help="Profile new jobs with a model (or profile: true) before their first launch "
             "(default: on when a stage needs profiles: the Synergy sizers greedy, tune, opt).")] = None,
    profile_window: Annotated[float, typer.Option(help="Seconds of progress measured per profiling point.")] = 5.0,
    profile_warmup: Annotated[float, typer.Option(help="Seconds skipped after a profile run's first progress line.")] = 2.0,
    profile_timeout: Annotated[float, typer.Option(
        help="Seconds a profile run may print no progress line before its job counts as unprofilable.")] = 60.0,
    log_level: Annotated[str, typer.Option(help="Log level: debug, info, warning, error.")] = "info",
    log_format: Annotated[str, typer.Option(help="Log lines as text or json (one object per line).")] = "text",
    access_log: Annotated[str | None, typer.Option(
        help="Write one line per request (time, client, user, method, path, status, seconds, bytes) to this "
             "file, or - for standard output; in --log-format. Off by default.")] = None,
    users: Annotated[Path | None, typer.Option(
        help="YAML/TOML map of gpuloom user to the OS account their jobs run as ('*': everyone else).")] = None,
    job_user: Annotated[str | None, typer.Option(
        help="OS account for jobs of users not in --users (default: gpuloom, created if missing).")] = None,
    allow_root_jobs: Annotated[bool, typer.Option(
        "--allow-root-jobs", help="Allow jobs to run as root (refused otherwise).")] = False,
    job_dir: Annotated[Path | None, typer.Option(
        help="Where default checkpoint directories go (default /var/tmp/gpuloom-ID when jobs run as other "
             "accounts, else STATE_DIR/checkpoints).")] = None,
    checkpoint_root: Annotated[list[Path] | None, typer.Option(
        help="A directory under which jobs may put their checkpoint_dir (repeatable; default --job-dir).")] = None,
    env_allow: Annotated[list[str] | None, typer.Option(
        help="A variable of the server's environment that jobs inherit, beyond LANG, LC_*, TZ, TERM and CUDA's "
             "(repeatable; e.g. PATH, LD_LIBRARY_PATH).")] = None,
    shared_tmp: Annotated[bool, typer.Option(
        "--shared-tmp", help="Jobs share this machine's /tmp and /dev/shm (default: each job that runs as another "
                             "account gets its own, removed when it ends).")] = False,
    keep_finished: Annotated[str | None, typer.Option(
        help="Delete finished jobs (and their logs) this long after they ended: 30d, 12h; a bare number is "
             "minutes.")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="TLS private key (serve HTTPS, with --ssl-certfile).")] = None,
    ssl_certfile: Annotated[Path | None, typer.Option(help="TLS certificate chain.")] = None,
    executor_name: Annotated[str | None, typer.Option(
        "--executor", help="How jobs run: local (default), ray (the default with --ray), or a plugin's executor "
                           "(an entry point of gpuloom.executors, or module:function).")] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray", help="Run jobs on a Ray cluster: auto (the one running here), its address, or local (start a "
                      "one-node one here, with --gpus N); the inventory comes from Ray's nodes.")] = None,
    slurm: Annotated[str | None, typer.Option(
        "--slurm", help="Run jobs on the Slurm cluster of this machine's slurm.conf ($SLURM_CONF): 'all' (every "
                        "node with GPU gres) or a partition; the inventory comes from Slurm's nodes.")] = None,
    shared_dir: Annotated[Path | None, typer.Option(
        help="Directory shared with every node (NFS, Lustre) for logs/ and checkpoints/ (default: the state dir; "
             "with --ray and no shared dir, logs are fetched through the node agents).")] = None,
    pids_limit: Annotated[int, typer.Option(
        min=0, help="Processes and threads a job may have at once (pids cgroup; 0 = no limit).")] = DEFAULT_PIDS_MAX,
    gpu_devices: Annotated[str, typer.Option(
        help="GPU device files, one per GPU in index order, that jobs may open only their own of (devices cgroup): "
             "auto (/dev/nvidia<minor> of discovered GPUs; none for a declared inventory), none, or a "
             "comma-separated list such as /dev/nvidia0,/dev/nvidia1.")] = "auto",
    max_pending: Annotated[int, typer.Option(
        help="Pending jobs a user may have (an array counts as its tasks; admins exempt).")] = 5000,
    max_array_size: Annotated[int, typer.Option(
        help="Tasks in one array, and indices below it (Slurm's MaxArraySize).")] = 1001,
    submit_rate: Annotated[float, typer.Option(
        help="Submissions per second a user may make, sustained (429 beyond; admins exempt).")] = 10.0,
    submit_burst: Annotated[int, typer.Option(help="Submissions a user may make at once.")] = 50,
    max_priority: Annotated[int, typer.Option(
        help="Highest priority a user may give a job where no queue sets max_priority (admins: any).")] = 0,
    log_dir: Annotated[Path | None, typer.Option(
        help="Where jobs' logs go (default STATE_DIR/logs, or SHARED_DIR/logs): put it on another file system "
             "than the database, so that logs cannot fill the database's disk.")] = None,
    log_cap: Annotated[str, typer.Option(
        help="Cut a running job's log in place when it grows over this size (256M, 1Gi; 0 = no cap): its "
             "first 1/8 and last 1/4 stay, with a note between them.")] = "256Mi",
    socket_path: Annotated[Path | None, typer.Option(
        "--socket", help="Unix socket for local clients (default /run/gpuloom/PORT.sock as root, else "
                         "STATE_DIR/gpuloom.sock); its directory must be writable by the server's account only.")] = None,
    max_connections: Annotated[int | None, typer.Option(
        help="Most open connections; at the limit the oldest one still sending its request is dropped "
             "(default: what the descriptor limit allows, at most 8192).")] = None,
    header_timeout: Annotated[float, typer.Option(
        help="Seconds a connection may take to send a request, headers and body (and its TLS handshake).")] = 10.0,
    keep_alive_timeout: Annotated[float, typer.Option(help="Seconds an idle keep-alive connection stays open.")] = 5.0,
    send_timeout: Annotated[float, typer.Option(
        help="Seconds a connection may leave its response unread (send buffers full) before it is closed.")] = 60.0,
) -> None:
    """Run the scheduler service: HTTP API + scheduling loop + executor."""
    from ..driver import Stack
    from ..policies.queues import load_queue_file
    from ..runtime.api.app import create_app, ensure_admin_token
    from ..runtime.exec.identity import Identities, IdentityError, private_dir
    from ..runtime.service.logfmt import configure
    from ..runtime.state.locks import AlreadyServed, ServerLocks
    from ..runtime.state.specs import parse_duration, parse_mem_bytes
    from ..runtime.state.store import Store

    try:
        configure(log_level, log_format)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    os.umask(0o077)  # everything the server writes is private: database, tokens, logs, run records
    access_handler = _access_log(access_log, log_format)
    if (ssl_keyfile is None) != (ssl_certfile is None):
        raise typer.BadParameter("give both --ssl-keyfile and --ssl-certfile, or neither")
    try:
        cap = parse_mem_bytes(log_cap, "--log-cap")
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    from ..runtime.exec.joblogs import MIN_CAP

    if cap and cap < MIN_CAP:
        raise typer.BadParameter(f"--log-cap: 0 (no cap) or at least {MIN_CAP} bytes (64Ki), got {log_cap!r}")
    connections = _connection_limits(max_connections, header_timeout, keep_alive_timeout, send_timeout)
    keep_s = None
    if keep_finished is not None:
        try:
            keep_s = parse_duration(keep_finished, "--keep-finished")
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    from ..runtime.service.admission import Limiter, SubmitLimits

    try:
        limits = SubmitLimits(max_pending, max_array_size, submit_rate, submit_burst, max_priority)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    sd = state_dir_path(state_dir)
    try:
        private_dir(sd, 0o700)
        identities = Identities.from_options(users, job_user, allow_root_jobs)
    except IdentityError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    if identities.switch and not shared_tmp:  # a job of another account sees its own /tmp, not these
        dirs = (job_dir or (shared_dir / "checkpoints" if shared_dir else None), *(checkpoint_root or ()))
        hidden = [str(d) for d in dirs if d is not None and _private_to_jobs(d)]
        if hidden:
            raise typer.BadParameter(f"{', '.join(hidden)}: under /tmp or /dev/shm, which each job gets its own of: "
                                     "jobs would not see their checkpoints there; choose another directory, or "
                                     "--shared-tmp")

    _check_slurm(slurm, ray_address, gpus, cluster)
    if ray_address is not None and (cluster is not None or (gpus is not None and ray_address != "local")):
        raise typer.BadParameter("--ray takes the inventory from the Ray cluster: give no --cluster, and --gpus "
                                 "only with --ray local (the GPUs its one node declares)")
    with user_errors():
        params = stack_params(param, model_opts)
        # (without --queues and --queue-policy: the stored tree's policy)
        queue = served_queue_stage(queue_policy, str(queues) if queues else None,
                                   db or f"sqlite:///{state_dir_path(state_dir) / 'gpuloom.db'}")
        check_policies(order, group, size, place, list(params), queue)  # did-you-mean, accepted -P names
        from .executors import EXECUTORS  # the executor by name: local, ray, or a plugin's

        make_executor = EXECUTORS.lookup(executor_name or ("slurm" if slurm is not None else
                                                           "local" if ray_address is None else "ray"))
        # the scheduler and throughput model `simulate` builds for the same options
        if reserve_depth < 0:
            raise typer.BadParameter(f"--reserve-depth must be >= 0, got {reserve_depth}")
        stack = Stack(order, group, size, place, not non_preemptive, params, queue=queue, reserve_depth=reserve_depth)
        sched = stack.scheduler()
        if ray_address is None and slurm is None:
            inventory = _inventory(gpus, cluster, cpus_per_node, mem_gb_per_node)
            # (bound to each other by the service's driver, after it adds what profiling needs)
            model = stack.model(inventory, seed)
    if not round_s > 0:
        raise typer.BadParameter(f"--round must be > 0, got {round_s}")
    url = db or f"sqlite:///{sd / 'gpuloom.db'}"
    from ..runtime.state.store import StoreError

    locks = ServerLocks()
    try:
        store = Store(url)
        locks.acquire(sd, store)  # one server per state directory and per database
    except (StoreError, AlreadyServed) as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    listeners = _listen(sd, host, port, socket_path, ssl_certfile is not None, connections.backlog)  # before any adoption
    token = ensure_admin_token(store, sd)
    del token
    # declared inventories may have more cores than this machine: their ids fold onto it
    import secrets

    service_id = store.set_meta_default("service_id", secrets.token_hex(4))
    from ..runtime.exec.local import DEFAULT_ENV_ALLOW

    allow = (*DEFAULT_ENV_ALLOW, *(env_allow or ()))
    from ..runtime.exec.slurm_plan import ForeignJobs
    from .executors import ExecutorContext

    with user_errors():
        executor, following = make_executor(ExecutorContext(
            sd, service_id, inventory if ray_address is None and slurm is None else None,
            gpus is not None or cluster is not None,
            allow, grace, not shared_tmp, shared_dir, job_dir, identities.switch, pids_limit, gpu_devices,
            ray_address, gpus, cpus_per_node, slurm))
        if following is not None:
            inventory = following.current
            model = stack.model(inventory, seed)
        for hook in getattr(executor, "plan_hooks", ()):  # work the executor sees outside the plan (Slurm's own jobs)
            sched.hooks.append(hook)
            sched.final_hooks.append(hook)
            if isinstance(hook, ForeignJobs):  # what it holds reaches the view: the place policy chooses around it
                sched.outside.append(hook.held_parts)
    from ..runtime.service.config import ServiceConfig
    from ..runtime.service.service import ProfilingConfig, Service

    profiling = None
    if profile if profile is not None else sched.needs_profiles:
        try:
            profiling = ProfilingConfig(warmup_s=profile_warmup, window_s=profile_window, timeout_s=profile_timeout,
                                        threshold=sched.size.profiling_threshold(),
                                        grace_s=min(grace, 5.0))
        except ValueError as e:
            msg = str(e)
            for field, opt in (("warmup_s", "--profile-warmup"), ("window_s", "--profile-window"),
                               ("timeout_s", "--profile-timeout"), ("profiling threshold", "-P threshold")):
                msg = msg.replace(field, opt)
            raise typer.BadParameter(msg) from None
    if job_dir is None and shared_dir is not None:
        job_dir = shared_dir / "checkpoints"
    try:
        if shared_dir is not None:  # job accounts pass through to their checkpoint directories, list nothing
            private_dir(shared_dir, 0o711)
        svc = Service(store, inventory, executor, sched,
                      ServiceConfig(sd, round_s=round_s, grace_s=grace, model=model, seed=seed,
                      launch_timeout_s=launch_timeout, profiling=profiling, identities=identities, job_dir=job_dir,
                      checkpoint_roots=checkpoint_root, keep_finished_s=keep_s, data_dir=shared_dir,
                      inventory=following, model_factory=lambda cl: stack.model(cl, seed),
                      log_dir=log_dir if log_dir is None else log_dir.absolute(), log_cap=cap))
    except IdentityError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    svc.limits = Limiter(limits, svc.clock.monotonic)
    with user_errors():
        if queues is not None:
            svc.queues.configure(load_queue_file(queues))
        else:
            svc.queues.validate()  # a stored tree must still fit the cluster and hold every active job
    tls = ssl_certfile is not None
    if not tls and not _loopback(host):
        msg = (f"serving plain HTTP on {host}, beyond this machine: tokens cross the network in clear text; "
               "give --ssl-keyfile and --ssl-certfile, or bind 127.0.0.1")
        err_console.print(f"[bold yellow]warning:[/] {escape(msg)}", highlight=False)
        logging.getLogger("gpuloom.service").warning(msg)
    from ..runtime.api.listen import remove_server_info, serve_http, write_server_info

    svc.server_locks = locks  # confirmed every round: another server that took the database makes this one stop
    svc.start()
    try:
        try:
            write_server_info(sd, listeners)
        except OSError as e:  # a full state disk: the server runs on (clients given --url still reach it)
            logging.getLogger("gpuloom.service").error("cannot write %s: %s", sd / "server.json", e)
        svc.watchdog.notify("READY=1")  # systemd (Type=notify): serving; the loop pings its watchdog
        logging.getLogger("gpuloom.service").info(
            "serving %s on %s and %s (dashboard %s/, API docs %s/docs; %d node%s, %d GPU%s; stages %s; store %s; "
            "at most %d connections)", "gpuloom", listeners.url, listeners.unix_path or "no socket", listeners.url,
            listeners.url, inventory.num_nodes, "s" * (inventory.num_nodes != 1), inventory.num_gpus,
            "s" * (inventory.num_gpus != 1), "/".join(sched.names.values()), url, connections.max_connections)
        api = create_app(svc)
        if access_handler is not None:
            from ..runtime.api.access import enable

            enable(api, access_handler)
        serve_http(api, listeners, connections, ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None,
                   ssl_certfile=str(ssl_certfile) if ssl_certfile else None, metrics=svc.telemetry.registry,
                   stop_when=lambda: svc.gave_up is not None)
    finally:
        svc.shutdown()
        remove_server_info(sd)  # still holding the lock: no other server has written it
        listeners.close()
        locks.release()
    if svc.gave_up is not None:  # the jobs run on: the server that took the database adopts them
        err_console.print(f"[bold red]error:[/] {escape(svc.gave_up)}", highlight=False)
        raise typer.Exit(3)


def _access_log(target: str | None, fmt: str) -> logging.Handler | None:
    """``--access-log``'s handler, opened now: a file that cannot be written is a usage error."""
    if target is None:
        return None
    from ..runtime.api.access import open_log

    try:
        return open_log(target, fmt)
    except OSError as e:
        raise typer.BadParameter(f"--access-log {target}: {e.strerror or e}") from None


def _gpu_devices(option: str, declared: bool) -> tuple[str, ...]:
    """``--gpu-devices``: auto, none, or a comma-separated list of device files."""
    if option == "none":
        return ()
    if option == "auto":
        from ..runtime.exec.discovery import discover_gpu_devices

        return () if declared else discover_gpu_devices()
    paths = tuple(p.strip() for p in option.split(","))
    if not all(p.startswith("/") for p in paths):
        raise typer.BadParameter(f"--gpu-devices: give auto, none or absolute device file paths, got {option!r}")
    return paths


def _private_to_jobs(path: Path) -> bool:
    real = Path(os.path.realpath(path))
    return any(real == Path(m) or Path(m) in real.parents for m in ("/tmp", "/dev/shm"))


def _connection_limits(max_connections: int | None, header_timeout: float, keep_alive: float,  # noqa: ANN202
                       send_timeout: float):
    from ..runtime.api.listen import ConnectionLimits, ListenError

    try:
        return ConnectionLimits.for_process(max_connections, header_timeout, keep_alive, send_timeout)
    except ListenError as e:
        raise typer.BadParameter(str(e)) from None


def _listen(sd: Path, host: str, port: int, socket_path: Path | None, tls: bool, backlog: int):  # noqa: ANN202
    """The server's TCP and Unix sockets, listening; exit 2 naming whoever holds them."""
    import atexit

    from ..runtime.api.listen import ListenError, Listeners, default_socket_path, remove_server_info

    remove_server_info(sd)  # a dead server's: nothing may point clients at a listener that is not this one
    try:
        listeners = Listeners(host, port, socket_path.absolute() if socket_path is not None else
                              lambda bound: default_socket_path(bound, sd), tls, backlog)
    except ListenError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    if listeners.unix_path is None:
        logging.getLogger("gpuloom.service").warning(
            "no Unix socket: %s is too long a path for one; give --socket", sd / "gpuloom.sock")
    atexit.register(listeners.close)  # a start that fails later leaves no socket file behind
    return listeners


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _check_slurm(slurm: str | None, ray_address: str | None, gpus: int | None, cluster: str | None) -> None:
    if slurm is None:
        return
    if ray_address is not None or gpus is not None or cluster is not None:
        raise typer.BadParameter("--slurm takes the inventory from Slurm's nodes: give no --ray, --gpus or --cluster")
    if slurm != "all" and not slurm.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise typer.BadParameter(f"--slurm: 'all' or a partition name, got {slurm!r}")


def _slurm_executor(slurm: str, service_id: str, grace: float, sd: Path, job_dir: Path | None,  # noqa: ANN202
                    shared_dir: Path | None, switch: bool, launcher: str = "sbatch"):
    """The Slurm executor (jobs named ``gpuloom-<service id>:<job>``) and the inventory that follows Slurm.

    Slurm writes jobs' output under the job directory (``slurm-out/<account>/``), which the nodes must share."""
    from ..core.cluster import ClusterError
    from ..runtime.exec.executor import ExecutorError
    from ..runtime.exec.identity import IdentityError, private_dir
    from ..runtime.exec.slurm import SlurmExecutor, SlurmInventory
    from ..runtime.service.security import default_job_dir

    base = job_dir or (shared_dir / "checkpoints" if shared_dir is not None else default_job_dir(sd, service_id, switch))
    try:
        private_dir(base, 0o711 if switch else 0o700)  # as the service makes it: job accounts pass through
        part, out = None if slurm == "all" else slurm, str(Path(base) / "slurm-out")
        if launcher == "steps":  # jobs as steps in allocations the service keeps (docs/slurm.md)
            from ..runtime.exec.slurm_steps import SlurmStepsExecutor

            ex: SlurmExecutor = SlurmStepsExecutor(f"gpuloom-{service_id}", part, grace_s=grace, out_dir=out)
        else:
            ex = SlurmExecutor(f"gpuloom-{service_id}", partition=part, grace_s=grace, out_dir=out, launcher=launcher)
        return ex, SlurmInventory(ex)
    except (ExecutorError, IdentityError, OSError) as e:
        raise ClusterError(f"--slurm: {e}") from None


def _ray_executor(address: str, service_id: str, grace: float, shared: bool,  # noqa: ANN202
                  env_allow: tuple[str, ...], gpus: int | None, cpus: int | None, private_tmp: bool):
    """The Ray executor (agents in the namespace ``gpuloom-<service id>``) and the inventory that follows Ray."""
    from ..runtime.exec.executor import ExecutorError
    from ..runtime.exec.ray_executor import RayExecutor, RayInventory
    from .common import ray_connect

    ray_connect(address, gpus, cpus)
    try:
        ex = RayExecutor(f"gpuloom-{service_id}", cgroup_parent=f"gpuloom-{service_id}", grace_s=grace,
                         logs="shared" if shared else "agent", env_allow=env_allow, private_tmp=private_tmp)
    except ExecutorError as e:
        from ..core.cluster import ClusterError

        raise ClusterError(str(e)) from None
    if not shared:
        logging.getLogger("gpuloom.service").warning(
            "no --shared-dir: logs are fetched through the node agents, and a job resumes from its checkpoint "
            "only on a node that sees its checkpoint_dir")
    return ex, RayInventory(ex)


def _inventory(gpus: int | None, cluster: str | None, cpus: int | None, mem_gb: float | None):  # noqa: ANN202
    """A declared cluster (``--cluster``), else this machine: discovered, or with ``--gpus N`` declared GPUs."""
    from ..core.cluster import Cluster, ClusterError, Node, parse_cluster

    if gpus is not None and cluster is not None:
        raise ClusterError("give --gpus or --cluster, not both")
    if cluster is not None:
        return parse_cluster(cluster, cpus, mem_gb)
    if gpus is not None and gpus < 1:
        raise ClusterError(f"--gpus must be >= 1, got {gpus}")
    mem_mb = int(mem_gb * 1000) if mem_gb is not None else None
    discover: Callable[..., Cluster] | None
    try:
        from ..runtime.exec.discovery import discover
    except ImportError:
        discover = None
    if discover is not None:
        try:
            cl = discover(gpus, cpus, mem_mb)
        except ValueError as e:  # DiscoveryError
            raise ClusterError(str(e)) from None
        if cl.num_gpus == 0:
            raise ClusterError("no GPUs found on this machine: declare an inventory with --gpus N or --cluster 2x4")
        return cl
    if gpus is None:
        raise ClusterError("no GPU discovery here: declare an inventory with --gpus N or --cluster 2x4")
    import psutil

    ncpu = cpus if cpus is not None else len(os.sched_getaffinity(0))
    mem = mem_mb if mem_mb is not None else psutil.virtual_memory().total // 10**6  # MB of 10^6 bytes
    return Cluster((Node("local", gpus, ncpu, mem),))


# -- client ------------------------------------------------------------------------------------
class Client:
    """The server found as :mod:`gpuloom.runtime.api.connect` says, and refused unless its account is trusted."""

    def __init__(self, url: str | None, token: str | None, state_dir: Path | None) -> None:
        import httpx

        from ..runtime.api.connect import ServerNotTrusted, find_server, transport

        sd = state_dir_path(state_dir)
        try:
            self.endpoint = find_server(url, sd)
        except ServerNotTrusted as e:
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
            raise typer.Exit(2) from None
        if token is None:
            f = sd / "admin.token"
            if f.exists():
                token = f.read_text().strip()
        self.url = self.endpoint.url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ca = os.environ.get("GPULOOM_CA_BUNDLE")  # a private CA for a server with its own certificate
        verify: Any = True
        if ca:
            import ssl

            verify = ssl.create_default_context(cafile=ca)
        tr, self.check = transport(self.endpoint, verify)
        self.http = httpx.Client(base_url=self.endpoint.base_url, headers=headers, timeout=30, verify=verify,
                                 transport=tr)
        self.last: Any = None  # the last response

    def unreachable(self, e: Exception) -> NoReturn:
        """Exit with why the server could not be reached (or was not trusted)."""
        refused = self.check.refusal if self.check is not None else None
        msg = refused or f"cannot reach {self.url}: {e}"
        err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False)
        raise typer.Exit(1) from None

    def refused(self, r: Any) -> NoReturn:
        """Exit with the error an answer of status 400 or more gives (its body read)."""
        try:
            detail = r.json().get("detail")
        except ValueError:
            detail = r.text
        if isinstance(detail, list):
            msgs = [f"{'.'.join(str(x) for x in d.get('loc', [])[1:]) or 'request'}: {d.get('msg')}" for d in detail]
            detail = "; ".join(msgs)
        err_console.print(f"[bold red]error ({r.status_code}):[/] {escape(str(detail))}", highlight=False)
        raise typer.Exit(2 if r.status_code in (400, 409, 422) else 1)

    def call(self, method: str, path: str, raw: bool = False, retries: int = 0, **kw: Any) -> Any:
        """The answer's JSON (or text); with ``raw`` the response itself.  Errors exit with their message.
        ``retries``: more tries on transport errors (for requests safe to repeat)."""
        import httpx

        for attempt in range(retries + 1):
            try:
                r = self.http.request(method, path, **kw)
                break
            except httpx.HTTPError as e:
                refused = self.check.refusal if self.check is not None else None
                if attempt < retries and refused is None:
                    time.sleep(0.5 * 2**attempt)
                    continue
                self.unreachable(e)
        self.last = r
        if r.status_code >= 400:
            self.refused(r)
        if raw:
            return r
        ctype = r.headers.get("content-type", "")
        return r.json() if ctype.startswith("application/json") else r.text


def load_job_file(path: Path) -> dict[str, Any]:
    """A job spec from YAML or JSON; errors name the file."""
    import yaml

    from .specfile import parse_spec_text

    try:
        text = path.read_text()
    except OSError as e:
        raise typer.BadParameter(f"{path}: {e.strerror}") from None
    try:
        data = parse_spec_text(text, path.suffix.lower() == ".json")  # (YAML: 1:30:00 stays a time)
    except (ValueError, yaml.YAMLError) as e:
        raise typer.BadParameter(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path}: expected a mapping of job fields (name, command, gpus, ...)")
    return data


def nodes(
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Nodes and their use (like sinfo); drained nodes with their reason (`nodes drain`, :mod:`.control`)."""
    ns = Client(url, token, state_dir).call("GET", "/nodes")
    if as_json:
        console.print_json(json.dumps(ns))
        return
    from ..runtime.state.history import format_mem

    t = Table("NODE", "STATE", "GPUS", "CPUS", "MEMORY", "GRES", "TYPE", "JOBS", "REASON", box=None)
    for n in ns:
        t.add_row(n["name"], n["state"], f"{n['gpus_used']}/{n['gpus']}", f"{n['cpus_used']}/{n['cpus']}",
                  f"{format_mem(n['mem_mb_used'])}/{format_mem(n['mem_mb'])}", n.get("gres", "-"), n["gpu_type"],
                  ",".join(n["jobs"]) or "-", n.get("reason") or "-")
    console.print(t)


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Argument(help="User name the token acts as.")],
    admin: Annotated[bool, typer.Option("--admin", help="Give the token admin rights.")] = False,
    expires: Annotated[str | None, typer.Option(help="Refuse the token after this long: 30d, 12h, 90s; a bare number is minutes.")] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a token for USER (needs the admin token)."""
    body: dict[str, Any] = {"user": user, "admin": admin}
    if expires is not None:
        body["expires"] = expires
    out = Client(url, token, state_dir).call("POST", "/tokens", json=body)
    if as_json:
        console.print_json(json.dumps(out))
    else:
        typer.echo(out["token"])


@token_app.command("list")
def token_list(
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List tokens (ids, never secrets): all with the admin token, else your own."""
    out = Client(url, token, state_dir).call("GET", "/tokens")
    if as_json:
        console.print_json(json.dumps(out))
        return
    t = Table("ID", "USER", "ADMIN", "CREATED", "EXPIRES", box=None)
    for k in out:
        exp = "never" if k["expires"] is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(k["expires"]))
        t.add_row(cell(k["id"]), cell(k["user"]), cell("yes" if k["admin"] else ""),
                  cell(time.strftime("%Y-%m-%d %H:%M", time.localtime(k["created"]))),
                  cell(exp + (" (expired)" if k["expired"] else "")))
    console.print(t)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[str, typer.Argument(help="Token id, as `gpuloom token list` shows it.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    state_dir: StateDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a token: your own, or any with the admin token."""
    out = Client(url, token, state_dir).call("DELETE", f"/tokens/{token_id}")
    if as_json:
        console.print_json(json.dumps(out))
    else:
        console.print(cell(f"token {out['id']} revoked"), highlight=False)
