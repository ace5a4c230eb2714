"""Which OS account runs a user's jobs.

Tokens name gpuloom users; jobs run as OS accounts, never as the server's own
account when that is root, unless the operator says so:

* a server **not running as root** cannot switch accounts: every job runs as
  the server's own (unprivileged) account, and a users map is refused;
* a server **running as root** runs each job as the account its user maps to
  in the users file (``--users FILE``), else as the dedicated account
  ``--job-user`` (default :data:`DEFAULT_JOB_USER`, created as a system
  account without a login shell on first start when it does not exist).  An
  account with uid 0 is refused unless ``--allow-root-jobs`` is given.

The users file is YAML (or TOML, by its suffix): a mapping of gpuloom user to
OS account, ``"*"`` for everyone else::

    alice: alice
    bob: bob
    "*": gpuloom

Everything is checked when the server starts (:meth:`Identities.check`), so a
bad map stops the server with a message, never a job at launch.

:func:`creatable` tells whether an account may create (or write into) a
directory, from the permission bits along its path, without switching to it.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("gpuloom.service")

DEFAULT_JOB_USER = "gpuloom"


class IdentityError(ValueError):
    """A users map or account that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def lookup(name: str) -> Account:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise IdentityError(f"no OS account {name!r} on this machine") from None
    try:
        groups = tuple(sorted(set(os.getgrouplist(name, pw.pw_gid))))
    except OSError:
        groups = (pw.pw_gid,)
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)


def current_account() -> Account:
    pw = pwd.getpwuid(os.geteuid())
    return Account(pw.pw_name, pw.pw_uid, os.getegid(), tuple(sorted(set(os.getgroups()) | {os.getegid()})),
                   pw.pw_dir)


def ensure_account(name: str) -> Account:
    """The account ``name``, created as a locked system account (no home, no login shell) if missing."""
    try:
        return lookup(name)
    except IdentityError:
        if os.geteuid() != 0:
            raise
    shell = "/usr/sbin/nologin" if Path("/usr/sbin/nologin").exists() else "/bin/false"
    r = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", shell, name], capture_output=True, text=True)
    if r.returncode != 0 and "already exists" not in r.stderr:
        raise IdentityError(f"cannot create the job account {name!r}: {r.stderr.strip() or r.returncode}; "
                            "create it (useradd --system NAME) or name another with --job-user")
    log.warning("created the system account %r to run jobs", name)
    return lookup(name)


def read_users_file(path: str | Path) -> dict[str, str]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise IdentityError(f"{p}: {e.strerror}") from None
    try:
        if p.suffix.lower() == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as e:
        raise IdentityError(f"{p}: {e}") from None
    if not isinstance(data, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise IdentityError(f"{p}: expected a mapping of gpuloom user to OS account name (strings)")
    return dict(data)


class Identities:
    """Maps gpuloom users to the OS accounts their jobs run as (see the module notes)."""

    def __init__(self, users: Mapping[str, str] | None = None, job_user: str | None = None,
                 allow_root: bool = False, switch: bool | None = None) -> None:
        self.switch = os.geteuid() == 0 if switch is None else switch
        self.users = dict(users or {})
        self.default = self.users.pop("*", "") or job_user or DEFAULT_JOB_USER
        self.allow_root = allow_root
        self._accounts: dict[str, Account] = {}

    @classmethod
    def from_options(cls, users_file: str | Path | None = None, job_user: str | None = None,
                     allow_root: bool = False) -> Identities:
        ids = cls(read_users_file(users_file) if users_file else None, job_user, allow_root)
        ids.check()
        return ids

    def check(self) -> None:
        """Resolve every account now (creating the default one if needed); raise on anything unusable."""
        if not self.switch:
            if self.users:
                raise IdentityError("only a server running as root can run jobs as other accounts: "
                                    "drop --users, or start the server as root")
            return
        names = {self.default, *self.users.values()}
        for name in sorted(names):
            acc = ensure_account(name) if name == self.default else lookup(name)
            if acc.is_root and not self.allow_root:
                raise IdentityError(f"jobs would run as {name!r} (uid 0): map users to unprivileged accounts, "
                                    "or pass --allow-root-jobs to allow it explicitly")
            self._accounts[name] = acc

    def os_user(self, user: str) -> str | None:
        """The account name ``user``'s jobs run as; None: the server's own account."""
        if not self.switch:
            return None
        name = self.users.get(user, self.default)
        acc = self.account_named(name)
        if acc.is_root:
            if not self.allow_root:
                raise IdentityError(f"jobs of {user!r} would run as root; refused (see --allow-root-jobs)")
            return None
        return name

    def account_named(self, name: str) -> Account:
        acc = self._accounts.get(name)
        if acc is None:
            acc = self._accounts[name] = lookup(name)
        return acc

    def account(self, user: str) -> Account:
        """The account ``user``'s jobs run as (the server's own when not switching)."""
        name = self.os_user(user)
        return current_account() if name is None else self.account_named(name)


def _allows(st: os.stat_result, acc: Account, bits: int) -> bool:
    """Whether ``acc`` has permission ``bits`` (a mask of r=4, w=2, x=1) on a file with ``st``."""
    if acc.is_root:
        return True
    if st.st_uid == acc.uid:
        have = (st.st_mode >> 6) & 7
    elif st.st_gid in acc.groups:
        have = (st.st_mode >> 3) & 7
    else:
        have = st.st_mode & 7
    return have & bits == bits


def creatable(path: str | Path, acc: Account) -> str | None:
    """None if ``acc`` can create directory ``path`` (or write into it, if it exists), else why not."""
    p = Path(os.path.abspath(path))
    chain = [p, *p.parents]
    existing = None
    for q in chain:
        if os.path.lexists(q):
            existing = q
            break
    if existing is None:  # not even /
        return f"{p}: no existing parent"
    try:
        st = os.stat(existing)
    except OSError as e:
        return f"{existing}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{existing} is not a directory"
    need = 7 if existing == p else 3  # an existing dir: read, write, enter; a parent: write, enter
    if not _allows(st, acc, need):
        return f"{acc.name} may not {'use' if existing == p else 'create directories in'} {existing}"
    for q in existing.parents:  # every directory above must be enterable
        try:
            if not _allows(os.stat(q), acc, 1):
                return f"{acc.name} may not enter {q}"
        except OSError as e:
            return f"{q}: {e.strerror}"
    return None




def private_dir(path: str | Path, mode: int = 0o700) -> Path:
    """Create ``path`` (and parents) for the server itself; a directory we own is set to ``mode``, anything
    else there (a symbolic link, another owner's directory) is refused."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True, mode=mode)
    st = os.lstat(p)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise IdentityError(f"{p} must be a directory owned by the server's account (uid {os.geteuid()})")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(p, mode)
    return p


def owned_dir(path: str | Path, acc: Account | None) -> Path:
    """Create directory ``path`` for a job running as ``acc`` (None: the server's account): owned by it,
    mode 0700.  Its parent must exist (the service's job directory)."""
    p = Path(path)
    try:
        p.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(p)
    if not stat.S_ISDIR(st.st_mode):
        raise IdentityError(f"{p} exists and is not a directory")
    if acc is not None and (st.st_uid, st.st_gid) != (acc.uid, acc.gid) and os.geteuid() == 0:
        os.chown(p, acc.uid, acc.gid)
    return p
