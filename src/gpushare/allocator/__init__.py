"""The allocator: folds the log into state and serves kube-scheduler's extender verbs."""
