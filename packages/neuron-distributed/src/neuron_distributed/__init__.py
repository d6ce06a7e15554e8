"""neuron-distributed: `torch.distributed` on the simulated Trainium device (the c10d backend `neuron`).

Status: the package installs next to neuron-device, but registers no c10d backend yet, so
`init_process_group(backend="neuron")` fails with torch's own "Invalid backend" error. Use `backend="gloo"` on CPU
tensors meanwhile.
"""

__version__ = "0.1.0"
