"""Executors: who runs job processes, and on what (local, Ray; cgroups, identities, discovery, clocks)."""
