"""Row softmax, numerically stable (``exp(x - max)``), 128 rows per tile with a masked ragged last tile."""

from __future__ import annotations

import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def softmax_kernel(x_tensor):
    """``softmax(x, axis=1)``: max on the Vector Engine, exp with a fused ``-max`` bias and row sum on the
    Scalar Engine, then one multiply by the reciprocal."""
    out_tensor = nl.ndarray(x_tensor.shape, dtype=x_tensor.dtype, buffer=nl.shared_hbm)
    num_rows, num_cols = x_tensor.shape
    ip = nl.arange(128)[:, None]
    jf = nl.arange(num_cols)[None, :]
    for i in nl.affine_range(math.ceil(num_rows / 128)):
        rows = i * 128 + ip < num_rows
        x = nl.load(x_tensor[i * 128 + ip, jf], mask=rows, dtype=np.float32)
        neg_max = nisa.tensor_reduce(np.max, data=x, axis=(1,), negate=True, mask=rows)
        row_sum = nl.ndarray((128, 1), dtype=np.float32)
        e = nisa.activation_reduce(np.exp, data=x, bias=neg_max, reduce_op=np.add, reduce_res=row_sum, mask=rows)
        y = nl.multiply(e, nl.reciprocal(row_sum, mask=rows), dtype=x_tensor.dtype, mask=rows)
        nl.store(out_tensor[i * 128 + ip, jf], value=y, mask=rows)
    return out_tensor
