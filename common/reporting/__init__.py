"""What a run reports: events and their listeners (console, MLPerf log, TensorBoard), plots."""
