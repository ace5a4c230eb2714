"""How the service's client commands reach the server: the options they share (``--url``, ``--token``,
``--state-dir``, ``--json``), the :class:`Client` that finds the server and sends the token, and job spec
files read for ``submit``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape

from .common import err_console

StateDirOpt = Annotated[
    Path | None, typer.Option("--state-dir", envvar="GPULOOM_STATE_DIR", help="State directory (default ~/.gpuloom).")
]
UrlOpt = Annotated[str | None, typer.Option("--url", envvar="GPULOOM_URL", help="Server URL.")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="GPULOOM_TOKEN", help="API token.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def state_dir_path(p: Path | None) -> Path:
    """The state directory, absolute (a relative one is taken from where the command runs, once)."""
    return Path(os.path.abspath(p if p is not None else Path.home() / ".gpuloom"))


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
