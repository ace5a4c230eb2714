"""gpuloom: a scheduler for shared GPU clusters running deep-learning training jobs."""

__version__ = "0.1.0"
