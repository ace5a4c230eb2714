"""The built-in executors of ``gpuloom serve``, one module each; each registers itself in
:data:`gpuloom.cli.executors.EXECUTORS` (a new one is a new module here, nothing else to edit)."""
