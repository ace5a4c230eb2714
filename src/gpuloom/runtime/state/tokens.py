"""API tokens: create (with an optional expiry), list, revoke.

A token is 32 random url-safe bytes; the store keeps only its sha256.  A
token's *id* is the first 12 hex digits of that hash: enough to name it in a
listing or a revocation, useless to authenticate.  Expired tokens are refused
at once (:meth:`~.store.Store.lookup_token`) and stay listed, marked expired,
until revoked.  A user lists and revokes their own tokens; an admin any.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from sqlalchemy import delete, select

from .store import TOKEN_ID_LEN as ID_LEN
from .store import Store, tokens_t


def create_token(store: Store, user: str, admin: bool = False, expires_in: float | None = None) -> str:
    token = secrets.token_urlsafe(32)
    store.add_token(token, user, admin, None if expires_in is None else time.time() + expires_in)
    return token


def list_tokens(store: Store, user: str | None = None) -> list[dict[str, Any]]:
    """Every token (of ``user``, if given): id, user, admin, created, expires, expired."""
    q = select(tokens_t).order_by(tokens_t.c.created)
    if user is not None:
        q = q.where(tokens_t.c.user == user)
    now = time.time()
    with store.lock, store.engine.connect() as c:
        rows = c.execute(q).mappings().all()
    return [{"id": r["token_hash"][:ID_LEN], "user": r["user"], "admin": bool(r["admin"]), "created": r["created"],
             "expires": r["expires"], "expired": r["expires"] is not None and r["expires"] <= now} for r in rows]


def revoke_token(store: Store, token_id: str, user: str | None = None) -> bool:
    """Delete the token whose id is ``token_id`` (only ``user``'s, if given); False if there is none."""
    if len(token_id) != ID_LEN or any(ch not in "0123456789abcdef" for ch in token_id):
        return False
    q = delete(tokens_t).where(tokens_t.c.token_hash.startswith(token_id, autoescape=True))
    if user is not None:
        q = q.where(tokens_t.c.user == user)
    with store.lock, store._begin(True) as c:
        return bool(c.execute(q).rowcount)
