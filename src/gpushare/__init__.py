"""gpushare: GPU sharing for Kubernetes.

A scheduler extender decides which card each pod gets, records the decision in an
allocation log on NATS JetStream, a binder writes it to the Kubernetes API, and a
kubelet device plugin hands the card to the container. Every service's state is a
fold over that log (see :mod:`gpushare.core.state`).
"""

__version__ = "0.1.0"
