"""The environment of a gang job spanning nodes: what torchrun and ``torch.distributed`` expect.

A job whose allocation spans nodes runs as one process per node part (executor
ids ``ID.RANK``, :mod:`..service.actuator`).  Every executor (local processes, Ray
agents) gets the same variables from :func:`gang_env`, so a multi-node job
sees the same thing wherever it runs:

==================  ===========================================================
variable            value
==================  ===========================================================
``MASTER_ADDR``     the address of rank 0's node (``127.0.0.1`` on one machine)
``MASTER_PORT``     a port that was free there when the job was launched
``WORLD_SIZE``      the number of processes gpuloom launched: one per node
``RANK``            this process's rank among them = ``NODE_RANK``
``NODE_RANK``       the index of this node part (also ``GROUP_RANK``)
``LOCAL_RANK``      0 (one process per node)
``LOCAL_WORLD_SIZE`` the GPUs of this part: how many workers torchrun starts here
``PET_*``           torchrun's defaults: ``PET_NNODES``, ``PET_NODE_RANK``,
                    ``PET_NPROC_PER_NODE``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``
==================  ===========================================================

Two ways to use it:

* a script that runs one process per node (all of the node's GPUs in it) calls
  ``torch.distributed.init_process_group(init_method="env://")`` directly:
  ``WORLD_SIZE`` and ``RANK`` describe exactly those processes;
* ``torchrun script.py`` with no flags: torchrun reads the ``PET_*`` variables
  (nodes, node rank, workers per node, rendezvous address) and starts
  ``LOCAL_WORLD_SIZE`` workers per node, giving each its own ``RANK``,
  ``WORLD_SIZE`` and ``LOCAL_RANK``.

A job on one node gets none of these (``torchrun --standalone`` picks its own
port there).
"""

from __future__ import annotations

from collections.abc import Sequence


def gang_env(rank: int, gpus_per_part: Sequence[int], master_addr: str, master_port: int) -> dict[str, str]:
    """The variables of part ``rank`` of a job whose parts hold ``gpus_per_part`` GPUs."""
    n = len(gpus_per_part)
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} outside 0..{n - 1}")
    if not 0 < master_port < 65536:
        raise ValueError(f"master port {master_port} outside 1..65535")
    local = str(gpus_per_part[rank])
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(n),
        "RANK": str(rank),
        "NODE_RANK": str(rank),
        "GROUP_RANK": str(rank),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": local,
        "PET_NNODES": str(n),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": local,
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(master_port),
    }
