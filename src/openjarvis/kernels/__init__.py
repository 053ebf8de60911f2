"""Multi-GPU communication kernels written for OpenJarvis (ParallelKittens style: small device
code, peers' memory read directly), each beside its NCCL baseline and a measured size table.
"""

from openjarvis.kernels.all_reduce import AllReduce, SizeTable
from openjarvis.kernels.checks import check_message
from openjarvis.kernels.overlap import AllGatherMatmul, MatmulReduceScatter

__all__ = ["AllGatherMatmul", "AllReduce", "MatmulReduceScatter", "SizeTable", "check_message"]
