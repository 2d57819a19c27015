"""The binder: the only writer to the Kubernetes API."""
