"""The scaling projection: a benchmark's time to train at N nodes of a described machine.

`python -m offline.projection ...` (cli.py lists the flags). One job a module:
  model.py             the arithmetic of each term (roofline, ring allreduce, staging, eval)
  spatial.py           the same for CosmoFlow samples split K ways (halos, gather, memory per device)
  rcp.py               epochs to converge, from mlperf_logging's RCP tables
  inputs.py            machine files, model costs, published points, data sets, node counts
  request.py           one projection asked for: a benchmark on a machine at several node counts
  questions.py         the questions users ask (staging dominance, busy and compute-bound batches)
  report.py            the table a person reads
  spatial_report.py    --spatial-ranks / --sample-edge: tables, verdicts and the run that prints them
  published_points.py  --calibrate and --validate: the projection against offline/published_points.yaml
  plots.py             the figures
  cli.py               the flags and main()
"""
