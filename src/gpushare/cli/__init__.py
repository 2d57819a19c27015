"""The ``gpushare`` command."""
