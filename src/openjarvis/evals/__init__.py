"""Evals: suites, the sandbox that runs model-written code, scoring, metrics and the runner."""
