"""``neuronxcc.nki.typing`` (``nt``): parameter annotations of legacy kernels.

``nt.mutable_tensor`` marks an HBM parameter the kernel may modify; the legacy compiler requires such a
parameter to be returned (``err_mutable_parameter_not_returned``), and so does our launcher. ``nt.tensor`` is the
plain tensor annotation; both accept ``[shape]``/``[dtype]`` subscripts (``nt.tensor[128, 512]``).
"""

from __future__ import annotations

__all__ = ["mutable_tensor", "scalar", "tensor"]


class _Annotation:
    """A subscriptable marker type (subscripting returns the marker itself)."""

    def __class_getitem__(cls, item):
        return cls


class tensor(_Annotation):
    """An NKI tensor parameter (read-only unless annotated :class:`mutable_tensor`)."""


class mutable_tensor(tensor):
    """An HBM tensor parameter the kernel writes to; it must be returned by the kernel."""


class scalar(_Annotation):
    """A compile-time scalar parameter."""
