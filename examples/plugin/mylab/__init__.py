"""A gpuloom plugin: the ``fewest-gpus`` order and the ``mylab`` trace format."""
