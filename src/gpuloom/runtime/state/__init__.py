"""What the service keeps: the store, its codec and locks, accounting, export, tokens."""

from . import audit  # noqa: F401,E402  (its table joins the store's metadata before any store opens)
