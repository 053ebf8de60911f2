"""Multi-GPU communication kernels written for OpenJarvis (ParallelKittens style: small device
code, peers' memory read directly), each beside its NCCL baseline and a measured size table.
"""

from openjarvis.kernels.all_reduce import AllReduce, SizeTable
from openjarvis.kernels.checks import check_message

__all__ = ["AllReduce", "SizeTable", "check_message"]
