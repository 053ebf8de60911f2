"""Multi-GPU communication kernels written for OpenJarvis (ParallelKittens style: small device
code, peers' memory read directly), each beside its NCCL baseline and a measured size table.

The overlapped GEMMs, which no engine runs, are in `kernels.experimental` and load only by name.
"""

from openjarvis.kernels.all_reduce import AllReduce, SizeTable
from openjarvis.kernels.checks import check_message

__all__ = ["AllReduce", "SizeTable", "check_message"]
