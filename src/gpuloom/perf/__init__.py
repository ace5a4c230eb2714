"""Throughput model, profile catalogues and profilers."""

from .model import DEFAULT_LOCALITY_PENALTY, Factor, LocalityFactor, ThroughputModel

__all__ = ["DEFAULT_LOCALITY_PENALTY", "Factor", "LocalityFactor", "ThroughputModel"]
