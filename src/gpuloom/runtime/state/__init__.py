"""What the service keeps: the store, its codec and locks, accounting, export, tokens."""
