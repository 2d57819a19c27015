"""The Kubernetes API adapter (official client): the one place that maps API errors."""
