"""Every environment variable neuron-distributed reads, declared once (name, type, default, doc).

How to declare a variable and how values are parsed: `neuron_spec.env`. The docs table is checked against
`VARIABLES` (``tests/test_docs_env_vars.py``).
"""

from __future__ import annotations

from neuron_spec.env import EnvVar

CHECK_COLLECTIVES = EnvVar("NEURON_DISTRIBUTED_CHECK_COLLECTIVES", bool, True,
                           "`0`: skip the cross-rank check that every rank calls the same collective (kind, dtype, "
                           "shape)", owner="distributed")

# TorchNeuron's collective variables, honoured by the cost model (`costs`): a collective moves its payload in
# buckets, each a pass of its own (one more set of hop latencies per bucket).
BUCKET_MB = EnvVar("TORCH_NEURONX_COLLECTIVE_BUCKETSIZE_IN_MB", float, 512.0,
                   "largest bucket (MB) a collective's payload is split into; each bucket is one ring pass in the "
                   "simulated time", owner="distributed", minimum=1e-6)
MIN_BUCKETS = EnvVar("TORCH_NEURONX_COLLECTIVE_MIN_BUCKETS", int, 0,
                     "least number of buckets of a collective (`> 1` splits even small payloads)", owner="distributed",
                     minimum=0)
SPLIT_ALLGATHER = EnvVar("NEURON_USE_SPLIT_ALLGATHER", bool, True,
                         "`0`: an all-gather is one pass whatever its size (no bucketing)", owner="distributed")
SPLIT_REDUCE_SCATTER = EnvVar("NEURON_USE_SPLIT_REDUCE_SCATTER", bool, True,
                              "`0`: a reduce-scatter is one pass whatever its size (no bucketing)", owner="distributed")
NO_EFFECT: tuple[EnvVar, ...] = (
    EnvVar("TORCH_NEURONX_ENABLE_HOST_CC", str, None, "accepted, no effect here: collectives already run on the host "
           "(Gloo); their simulated time is NeuronLink's", owner="distributed"),
    EnvVar("NEURON_RT_ENABLE_HOST_CC", str, None, "accepted, no effect here: collectives already run on the host "
           "(Gloo); their simulated time is NeuronLink's", owner="distributed"),
)

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

VARIABLES: tuple[EnvVar, ...] = (CHECK_COLLECTIVES, BUCKET_MB, MIN_BUCKETS, SPLIT_ALLGATHER, SPLIT_REDUCE_SCATTER,
                                 *LAUNCHER, *NO_EFFECT)
