"""What runs outside a training process: synthetic data writing, scoring, result sets, weak
scaling and characterization reports.

Nothing here is imported by a training process (common/ owns that); these tools read or
write run folders, logs and data sets before or after training, or launch training runs
as child processes.
"""
