"""`python -m openjarvis` is the `ipw` command."""

from openjarvis.cli.ipw import main

main()
