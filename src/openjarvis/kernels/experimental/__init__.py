"""Kernels that no engine runs yet, kept with their tests and benchmarks: import each module by
its full name (`openjarvis.kernels.experimental.overlap`); nothing outside tests and benchmarks
imports this package, so loading the engines never loads it.
"""

__all__: list[str] = []
