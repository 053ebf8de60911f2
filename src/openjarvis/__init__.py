"""OpenJarvis: local inference, an honest energy meter, and accuracy per joule.

`import openjarvis` stays light: hardware and engine libraries load only where used.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
