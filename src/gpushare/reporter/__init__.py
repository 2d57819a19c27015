"""The reporter: each node's GPU inventory (NVML, or simulated), published with a heartbeat.

* :mod:`.backends`: the ``GpuBackend`` protocol every source of cards implements;
* :mod:`.nvml`: a real node through pynvml, health from XID critical errors;
* :mod:`.topology`: NVLink lanes and PCIe paths between cards, from NVML's answers (pure);
* :mod:`.mps`: whether an MPS control daemon serves the cards (a pure decision, one file check);
* :mod:`.simulated`: cards given as MiB sizes, with stable UUIDs and a chosen topology;
* :mod:`.fixture` and :mod:`.recording`: replaying what NVML once returned;
  :mod:`.capture` records such a fixture on a GPU machine;
* :mod:`.health`: health events and the marks they leave on cards;
* :mod:`.publishing`: the per-node loop (publish on change, else every heartbeat);
* :mod:`.settings`, :mod:`.running` and ``__main__``: the ``gpushare reporter`` process.
"""
