"""Command-line entry points: parse options, call one function, print."""
