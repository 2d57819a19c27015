"""The pure core: values in, values out. No clock, no I/O, no logging.

Import-linter keeps it that way (see ``[tool.importlinter]`` in pyproject.toml).
"""
