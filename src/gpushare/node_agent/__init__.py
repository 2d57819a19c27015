"""The node agent: the kubelet device plugin that hands each container its card."""
