"""Replay an Alibaba-format GPU trace through the core's placement, under FGD's protocol."""
