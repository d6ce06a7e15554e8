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

VARIABLES: tuple[EnvVar, ...] = (CHECK_COLLECTIVES, BUCKET_MB, MIN_BUCKETS, SPLIT_ALLGATHER, SPLIT_REDUCE_SCATTER,
                                 *NO_EFFECT)
