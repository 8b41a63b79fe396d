"""Training-input filters: skip what a dedup run removed (manifest) or dedup a stream online."""
