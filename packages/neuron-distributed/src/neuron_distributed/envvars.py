"""Every environment variable neuron-distributed reads, declared once (name, type, default, doc).

How to declare a variable and how values are parsed: `neuron_spec.env`. The docs table is checked against
`VARIABLES` (``tests/test_docs_env_vars.py``).
"""

from __future__ import annotations

from neuron_spec.env import EnvVar

CHECK_COLLECTIVES = EnvVar("NEURON_DISTRIBUTED_CHECK_COLLECTIVES", bool, True,
                           "`0`: skip the cross-rank check that every rank calls the same collective (kind, dtype, "
                           "shape)", owner="distributed")

VARIABLES: tuple[EnvVar, ...] = (CHECK_COLLECTIVES,)
