"""The run of one benchmark: entry point, trainer, run modes, steps, results and failures."""
