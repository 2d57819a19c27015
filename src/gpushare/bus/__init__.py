"""The JetStream adapter: streams, subjects, appends with compare-and-set, and followers."""
