"""The first thing a site runs: what each rank got, Horovod's allreduce times, a benchmark beside its projection.

  python -m offline.preflight                                  # one rank, CosmoFlow's synthetic config
  make preflight NP=2                                          # 2 ranks on this host (horovodrun, Gloo)
  srun -N 2 --ntasks-per-node 4 --gpus-per-node 4 python -m offline.preflight --expect-gpus 4 \\
      --machine machines/perlmutter-a100.yaml                  # or: sbatch ... slurm/preflight.sbatch
  mpirun -np 2 python -m offline.preflight --tiny --sweep-sizes 8,1M

Under any launcher, every rank runs it; rank 0 prints:
  1. per rank: host, device and GPU (NVML UUID), the GPUs it sees, its CPU affinity and the threads
     a training run would use (and the rule that chose them); Horovod's controller and whether it
     was built with NCCL, MPI and Gloo (ranks.py);
  2. a sweep of single eager Horovod allreduces, each timed end to end (Horovod's cycle and
     negotiation included: not bare NCCL, which nccl-tests' all_reduce_perf measures), in
     all_reduce_perf's columns: time, algorithm bandwidth (bytes / time) and bus bandwidth
     (algbw x 2(n-1)/n) per size (sweep.py);
  3. a benchmark of a config (train.py --benchmark STEPS, the real trainer: common.run.trainer) and,
     beside it, the step time offline.projection gives for that model on a machine file; with no
     --machine, a file describing this host, written from lscpu and a measured matmul peak
     (host.py); the verdict is their ratio against a tolerance (verdict.py).
It exits 2 after one `error:` line on bad input (a flag, an unknown machine file) or when two ranks
of a host would share one GPU (the training's own init check), 1 when --expect-gpus N is given and a
rank's TensorFlow sees fewer GPUs; the verdict itself is reported, not an exit code.
"""
