"""The HTTP door: jobs, operator endpoints, queues, the dashboard; where the server listens and how clients find it."""
