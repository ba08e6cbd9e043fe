"""What runs outside a training process: scoring, result sets, weak scaling, characterization
reports and the scaling projection.

Nothing here is imported by a training process (common/ owns that); these tools read or
write run folders, logs and data sets before or after training, or launch training runs
as child processes.
"""
