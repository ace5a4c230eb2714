"""The scheduling loop and what it owns: actuator, recovery, admission, queues, security, telemetry."""
