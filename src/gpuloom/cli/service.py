"""The service face of the CLI: ``gpuloom serve`` and Slurm-like clients.

What ``serve`` builds from its options besides the service (inventory, executors, sockets) is in
:mod:`.serving`; how the clients reach the server (their shared options, :class:`.client.Client`) in
:mod:`.client`.

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
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..core.registry import STAGE_DEFAULTS
from ..runtime.exec.cgroups import DEFAULT_PIDS_MAX
from . import app
from .client import Client, JsonOpt, StateDirOpt, TokenOpt, UrlOpt, load_job_file, state_dir_path
from .common import SafeTable as Table
from .common import cell, check_policies, console, err_console, model_options, stack_params, user_errors
from .queues import served_queue_stage
from .serving import _access_log, _check_slurm, _connection_limits, _inventory, _listen, _loopback, _private_to_jobs

__all__ = ["DEFAULT_PORT", "Client", "JsonOpt", "StateDirOpt", "TokenOpt", "UrlOpt", "load_job_file", "nodes", "serve",
           "state_dir_path", "token_app"]

token_app = typer.Typer(help="Manage API tokens (admin).", no_args_is_help=True)
app.add_typer(token_app, name="token")

DEFAULT_PORT = 8642


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
    from ..runtime.state.locks import AlreadyServed, open_served
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
    if not round_s > 0:
        raise typer.BadParameter(f"--round must be > 0, got {round_s}")
    url = db or f"sqlite:///{sd / 'gpuloom.db'}"
    from ..runtime.state.store import StoreError

    try:  # one server per state directory and per database; on a full state disk, once there is room
        store, locks = open_served(url, sd, Store)
    except (StoreError, AlreadyServed) as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    with user_errors():
        params = stack_params(param, model_opts)
        # (without --queues and --queue-policy: the stored tree's policy, read from the store just opened)
        queue = served_queue_stage(queue_policy, str(queues) if queues else None, url, store)
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
