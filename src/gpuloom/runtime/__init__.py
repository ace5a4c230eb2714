"""The real scheduler service: store, API, job lifecycle, executors, GPU discovery."""
