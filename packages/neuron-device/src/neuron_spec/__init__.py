"""neuron_spec: what the simulated Trainium is, with no torch and nothing else of ours (shipped in neuron-device).

=================== ===========================================================================================
``hardware``        every figure of every target (trn1/trn2/trn3) and instance type, with sources; aliases;
                    prices.
``machine``         the one parser of the target/topology variables (``NEURON_PLATFORM_TARGET_OVERRIDE``,
                    ``NEURON_SIM_INSTANCE_TYPE``, ...): `read_topology`, `read_target`, `read_lnc`.
``env``             `EnvVar`, how every package declares an environment variable, and the one parser of values.
=================== ===========================================================================================

Importable from the ``nki`` core (NumPy-only) and from every wheel; the layering check (``tests/test_layering.py``)
fails if it imports torch or any of our packages.
"""
