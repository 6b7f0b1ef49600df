"""Student side: build/load the causal LM (``model``), shard it with FSDP2 (``parallelize``)."""
