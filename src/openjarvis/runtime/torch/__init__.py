"""The torch engine: one readable model for the Llama, Qwen and Gemma 3 families, its loaders,
tensor parallelism over several GPUs, and the engine that serves requests with it.

Importing this package needs torch (`pip install 'openjarvis[torch]'`); nothing else imports it.
"""
