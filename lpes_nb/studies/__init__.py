"""One module per notebook study (attention, representations, probes, calibration,
benchmarks, search, position_map, model_size, regime_search, second_model, fitness_proxy,
lpes_at_power), the typed profiles that size them (profiles), and the claims ledger written from
their tables (claims)."""
