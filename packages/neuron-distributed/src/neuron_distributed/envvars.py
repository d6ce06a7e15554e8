"""Every environment variable neuron-distributed reads, declared once (name, type, default, doc).

How to declare a variable and how values are parsed: `neuron_spec.env`. The docs table is checked against
`VARIABLES` (``tests/test_docs_env_vars.py``).
"""

from __future__ import annotations

from neuron_spec.env import EnvVar

__all__ = ["CHECK_COLLECTIVES", "LAUNCHER", "MASTER_ADDR", "MASTER_PORT", "RANK", "VARIABLES", "WORLD_SIZE"]

CHECK_COLLECTIVES = EnvVar("NEURON_DISTRIBUTED_CHECK_COLLECTIVES", bool, True,
                           "`0`: skip the cross-rank check that every rank calls the same collective (kind, dtype, "
                           "shape)", owner="distributed")

# torchrun's variables, which neuron-plan sets for each planned rank (and plan mode reads for init_process_group).
# RANK is declared (and documented) by neuron-compile, which reads it; neuron-plan only sets it, so it is not in
# this package's VARIABLES.
RANK = EnvVar("RANK", int, 0, "under a launcher, this process's rank", owner="distributed")
WORLD_SIZE = EnvVar("WORLD_SIZE", int, 1, "under a launcher, the number of ranks (neuron-plan: the whole cluster)",
                    owner="distributed")
LOCAL_WORLD_SIZE = EnvVar("LOCAL_WORLD_SIZE", int, 1, "under a launcher, the ranks of one node (neuron-plan sets it)",
                          owner="distributed")
MASTER_ADDR = EnvVar("MASTER_ADDR", str, None, "under a launcher, the rendezvous host (neuron-plan sets a placeholder: "
                     "plan mode does not rendezvous)", owner="distributed")
MASTER_PORT = EnvVar("MASTER_PORT", str, None, "under a launcher, the rendezvous port (set by neuron-plan likewise)",
                     owner="distributed")
LAUNCHER = (WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)

VARIABLES: tuple[EnvVar, ...] = (CHECK_COLLECTIVES, *LAUNCHER)
