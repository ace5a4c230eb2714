"""The Slurm-like client commands against a real server."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from gpuloom.cli import app
from service_util import Server, job, job_writable, kill_jobs, wait_for

NCPU = len(os.sched_getaffinity(0))
runner = CliRunner()


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    r = runner.invoke(app, list(args), env=env)
    return r.exit_code, r.output


def test_submit_queue_nodes_logs_cancel_token(tmp_path: Path) -> None:
    s = Server(tmp_path, "--cluster", "1x2", "--cpus-per-node", str(NCPU), "--round", "0.2").start()
    sd = ("--state-dir", str(tmp_path))
    try:
        (tmp_path / "hello.yaml").write_text(
            "name: hello\ncommand: echo hello from $GPULOOM_JOB_ID\ngpus: 1\nmem: 1G\ntime_limit: '10:00'\n"
        )
        (tmp_path / "sleep.json").write_text(json.dumps({"name": "sleeper", "command": "sleep 60", "gpus": 2}))
        code, out = cli("submit", str(tmp_path / "hello.yaml"), *sd)
        assert code == 0 and out.strip() == "Submitted job 1"
        wait_for(lambda: cli("queue", "--all", "--json", *sd)[1].count('"finished"') == 1, what="hello to finish")
        code, out = cli("logs", "1", *sd)
        assert out == "hello from 1\n"
        code, out = cli("submit", str(tmp_path / "sleep.json"), "--json", *sd)
        assert json.loads(out)["id"] == 2
        wait_for(lambda: '"launching"' in cli("queue", "--json", *sd)[1], what="sleeper to launch")
        code, out = cli("queue", *sd)
        assert code == 0 and "sleeper" in out and " R " in out and "hello" not in out
        code, out = cli("nodes", "--json", *sd)
        (node,) = json.loads(out)
        assert (node["name"], node["gpus_used"], node["jobs"]) == ("node-0", 2, ["2"])
        code, out = cli("nodes", *sd)
        assert "2/2" in out
        # a user token cannot cancel the admin's job
        code, tok = cli("token", "create", "alice", *sd)
        assert code == 0
        code, out = cli("cancel", "2", "--token", tok.strip(), *sd)
        assert code == 1 and "403" in out
        code, out = cli("cancel", "2", *sd)
        assert code == 0 and out.startswith("job 2:")
        wait_for(lambda: '"cancelled"' in cli("queue", "--all", "--json", *sd)[1], what="cancel")
        # bad spec: the error names the field; a malformed file names the file
        (tmp_path / "bad.yaml").write_text("command: x\ngpus: 3\n")
        code, out = cli("submit", str(tmp_path / "bad.yaml"), *sd)
        assert code == 2 and "gpus" in out and "needs 3 GPUs" in out
        (tmp_path / "broken.yaml").write_text("command: [unclosed\n")
        code, out = cli("submit", str(tmp_path / "broken.yaml"), *sd, env={"COLUMNS": "300"})  # (path not wrapped)
        assert code == 2 and "broken.yaml" in out
        # URL and token from the environment
        env = {"GPULOOM_URL": s.url, "GPULOOM_TOKEN": tok.strip()}
        code, out = cli("queue", "--all", "--json", "--state-dir", str(tmp_path / "elsewhere"), env=env)
        assert code == 0 and len(json.loads(out)) == 2
    finally:
        s.stop()
        kill_jobs(tmp_path)


def test_a_job_runs_where_it_was_submitted_from(tmp_path: Path, monkeypatch) -> None:
    """As sbatch: the submitting shell's directory by default, --chdir relative to it; a directory the
    node lacks runs the job in its account's home (or /), and the job's log says so first."""
    s = Server(tmp_path, "--cluster", "1x2", "--cpus-per-node", str(NCPU), "--round", "0.2").start()
    sd = ("--state-dir", str(tmp_path))
    here = job_writable(tmp_path)
    (here / "sub").mkdir()
    os.chmod(here / "sub", 0o755)
    monkeypatch.chdir(here)
    try:
        assert cli("submit", "--mem", "1G", *sd, "--", "pwd") == (0, "Submitted job 1\n")
        assert cli("submit", "--mem", "1G", "--chdir", "sub", *sd, "--", "pwd") == (0, "Submitted job 2\n")
        (here / "job.yaml").write_text("command: pwd\ngpus: 1\nmem: 1G\nworkdir: /no/such/dir\n")
        assert cli("submit", "job.yaml", *sd) == (0, "Submitted job 3\n")
        wait_for(lambda: cli("queue", "--all", "--json", *sd)[1].count('"finished"') == 3, what="three jobs")
        assert cli("logs", "1", *sd)[1] == f"{here}\n"
        assert cli("logs", "2", *sd)[1] == f"{here / 'sub'}\n"
        note, pwd = cli("logs", "3", *sd)[1].splitlines()
        assert note == f"gpuloom: no directory /no/such/dir on this node; running in {pwd}"
        assert pwd != str(here) and os.path.isdir(pwd)
        with s.client() as c:
            assert [job(c, i)["workdir"] for i in (1, 2, 3)] == [str(here), str(here / "sub"), "/no/such/dir"]
    finally:
        s.stop()
        kill_jobs(tmp_path)


def test_export_copies_the_named_variables_of_the_submitting_shell(tmp_path: Path, monkeypatch) -> None:
    """As sbatch --export=NAMES: the job gets those variables of the submitting shell (a job's PATH is
    otherwise the default one, so a `python3` of the user's own environment would not be found);
    --env wins over it; a name the shell lacks, ALL or NAME=VALUE is refused before anything is sent."""
    s = Server(tmp_path, "--cluster", "1x2", "--cpus-per-node", str(NCPU), "--round", "0.2").start()
    sd = ("--state-dir", str(tmp_path))
    monkeypatch.chdir(job_writable(tmp_path))
    shell = {"PATH": f"/opt/venv-x/bin:{os.environ['PATH']}", "DEMO_A": "from the shell", "DEMO_B": "b"}
    show = ("--", "sh", "-c", 'echo "$PATH|$DEMO_A|$DEMO_B"')
    try:
        assert cli("submit", "--mem", "1G", *sd, *show, env=shell) == (0, "Submitted job 1\n")
        assert cli("submit", "--mem", "1G", "--export", "PATH,DEMO_A", "--env", "DEMO_A=from --env", *sd, *show,
                   env=shell) == (0, "Submitted job 2\n")
        assert cli("submit", "--mem", "1G", "--export", " DEMO_B ,", *sd, *show, env=shell) == (0, "Submitted job 3\n")
        for bad, why in (("NO_SUCH_VAR", "--export NO_SUCH_VAR: not set in this shell"),
                         ("ALL", "name the variables to copy"), ("DEMO_A=x", "set a value with --env")):
            code, out = cli("submit", "--export", bad, *sd, *show, env={**shell, "COLUMNS": "300"})
            assert code == 2 and why in out, out
        wait_for(lambda: cli("queue", "--all", "--json", *sd)[1].count('"finished"') == 3, what="three jobs")
        default = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        assert cli("logs", "1", *sd)[1] == f"{default}||\n"
        assert cli("logs", "2", *sd)[1] == f"{shell['PATH']}|from --env|\n"
        assert cli("logs", "3", *sd)[1] == f"{default}||b\n"
        assert len(json.loads(cli("queue", "--all", "--json", *sd)[1])) == 3  # the refused ones were never sent
    finally:
        s.stop()
        kill_jobs(tmp_path)
