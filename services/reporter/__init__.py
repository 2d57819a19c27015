"""The reporter: each node's GPU inventory (NVML, or simulated), published with a heartbeat."""
