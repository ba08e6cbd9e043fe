"""Distribution over Horovod ranks: collectives, spatial splits, group batch norm, fingerprints."""
