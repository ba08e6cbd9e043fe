# shellcheck shell=bash
# Sourced by the sbatch scripts: everything site-specific comes from the environment.
#
#   REPO        this repository on a shared file system (default: the submit directory)
#   DATA_DIR    the data set (train/, validation/ [, stats.h5]); required
#   STAGE_DIR   node-local directory to stage each node's shard into (e.g. /tmp/$USER/data);
#               unset: read DATA_DIR in place. '{node}' expands to the node index.
#   OUTPUT_DIR  run directory (default: $REPO/runs/<benchmark>-$SLURM_JOB_ID)
#   BENCH       the benchmark (`python -m common.benchmarks names`); slurm/cosmoflow.sbatch and
#               slurm/deepcam.sbatch set it
#   CONFIG      YAML config (default: what the job's ranks run, said in its first lines: the
#               closed-division config of an RCP global batch that ranks x local batch x gradient
#               accumulation reaches, else the nearest open one; see job_config below)
#   CONTAINER   an Apptainer/Singularity image (make sif): ranks run the image's code in
#               `apptainer exec $CONTAINER` (APPTAINER: the command; default: apptainer, singularity,
#               else tools/apptainer.sh)
#   VENV        otherwise a virtual environment to activate (default: $REPO/.venv)
#   SRUN_MPI    srun's PMI plugin (default: pmix; `srun --mpi=list` shows yours)
#   CPUS_PER_TASK  CPUs bound to each rank (default: the CPUs the job holds on a node / its tasks
#               there: the whole node's under the scripts' #SBATCH --exclusive)
#   CPU_BIND    srun's --cpu-bind (default on a node with nvidia-smi: mask_cpu: masks that put local
#               rank i, which uses GPU i, on CPUS_PER_TASK CPUs of GPU i's NUMA domain, read from
#               `nvidia-smi topo -m`; without nvidia-smi, or where its output does not give them:
#               cores, each rank its own cores). A site gives its own, e.g. map_ldom:3,2,1,0;
#               none: no binding. See docs/scaling.md#gpus-and-cpu-binding.
#   EXTRA_ARGS  more train.py flags, e.g. "--amp --seed 7"
#   ORG         result sets: the submitter's name in the submission layout (default: the
#               config's mlperf.org)
# Account, partition, QoS, time: give them to sbatch (-A, -p, -q, -t); none are set here.

set -euo pipefail
REPO=${REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
: "${DATA_DIR:?set DATA_DIR to the data set directory}"
SRUN_MPI=${SRUN_MPI:-pmix}
EXTRA_ARGS=${EXTRA_ARGS:-}
cd "$REPO"

if [[ -n "${CONTAINER:-}" ]]; then
    # The image's own code and Python run (/opt/mlperf-hpc, its working directory): the benchmark
    # table, train scripts and configs are read inside it. Bound in at their own paths: the data,
    # REPO (runs/ and a CONFIG given as a host path), OUTPUT_DIR and the staging root, which
    # Apptainer refuses when missing, so it is made first on every node. --no-home: nothing read
    # from the user's home; not --containall, whose clean environment would drop SLURM's and PMIx's
    # variables and whose private /tmp would hide node-local staging. --nv where the node has GPUs.
    RUNTIME=${APPTAINER:-$(command -v apptainer || command -v singularity || echo "$REPO/tools/apptainer.sh")}
    binds=$REPO,$DATA_DIR${OUTPUT_DIR:+,$OUTPUT_DIR}
    if [[ -n ${STAGE_DIR:-} ]]; then
        stage_root=$STAGE_DIR
        [[ $STAGE_DIR != *\{* ]] || { stage_root=${STAGE_DIR%%\{*}; stage_root=${stage_root%/*}; }
        if [[ -n ${SLURM_JOB_ID:-} ]]; then
            srun --mpi=none --ntasks-per-node=1 --ntasks="${SLURM_NNODES:-1}" mkdir -p "$stage_root"
        else
            mkdir -p "$stage_root"
        fi
        binds+=,$stage_root
    fi
    [[ -z ${OUTPUT_DIR:-} ]] || mkdir -p "$OUTPUT_DIR"
    nv=()
    command -v nvidia-smi >/dev/null && nv=(--nv)
    # The image's OpenMPI reads its job from the host's PMIx server (srun --mpi=pmix); PMIx's
    # shared-memory store lives in SLURM's spool, which the container does not see: hash instead.
    export PMIX_MCA_gds=${PMIX_MCA_gds:-hash}
    # The image a result ran in, for its summary.json: the SHA-256 `make sif` wrote beside it.
    MLPERF_HPC_IMAGE_SHA256=$(cut -d' ' -f1 "$CONTAINER.sha256" 2>/dev/null || sha256sum "$CONTAINER" | cut -d' ' -f1)
    export MLPERF_HPC_IMAGE_SHA256
    PYTHON=("$RUNTIME" exec "${nv[@]}" --no-home --pwd /opt/mlperf-hpc --bind "$binds" "$CONTAINER" python)
else
    VENV=${VENV:-$REPO/.venv}
    PYTHON=("$VENV/bin/python")
fi

echo "[sbatch] job ${SLURM_JOB_ID:-?}: ${SLURM_NNODES:-1} node(s), ${SLURM_NTASKS:-1} task(s); python: ${PYTHON[*]}"

# CPUs and GPUs of a rank. Each rank is bound to CPUS_PER_TASK cores of its own (TensorFlow sizes its
# thread pools from them, common/cpu.py); srun of SLURM 22.05 does not inherit sbatch's
# --cpus-per-task, so it is given here. SLURM_CPUS_ON_NODE is what the job holds on this node: all of
# its CPUs under --exclusive, else what -c x tasks asked for (1 a task without -c). Every rank sees
# all of its node's GPUs and takes its local rank's (common/parallel/gpus.py): no --gpus-per-task or
# --gpu-bind, which would hide the others from it and cut NCCL's peer-to-peer (NVLink) paths between
# the ranks of a node. CUDA numbers the GPUs in PCI bus order, as NVML does, so a rank's GPU index and
# the UUID it reports name one GPU.
tasks_here=${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}
tasks_here=${tasks_here%%[(,]*}   # SLURM_TASKS_PER_NODE reads "4(x128)" or "4,3"
CPUS_PER_TASK=${CPUS_PER_TASK:-$(( ${SLURM_CPUS_ON_NODE:-1} / (tasks_here > 0 ? tasks_here : 1) ))}
(( CPUS_PER_TASK >= 1 )) || CPUS_PER_TASK=1
# Without CPU_BIND, a GPU node's ranks are bound next to their GPUs: --cpu-bind=cores alone follows
# SLURM's default distribution (block:cyclic, consecutive tasks on alternating sockets), which puts
# about half the ranks on the other socket from their GPU. common/parallel/gpu_binding.py reads each GPU's
# CPU affinity from `nvidia-smi topo -m` (this node's; the job's nodes are alike) and gives srun a
# mask_cpu: mask per local task, disjoint within a NUMA domain. SLURM cuts a mask to the CPUs the step
# holds ("Ignoring user CPU binding outside of job step allocation"): whole masks need the whole node
# (#SBATCH --exclusive). Where nvidia-smi gives no topology, the binding stays cores (its error said).
if [[ -z "${CPU_BIND:-}" ]]; then
    CPU_BIND=cores
    if command -v nvidia-smi >/dev/null && topology=$(nvidia-smi topo -m) &&
            binding=$("${PYTHON[@]}" -m common.parallel.gpu_binding gpu-local "$tasks_here" \
                "$CPUS_PER_TASK" <<< "$topology"); then
        CPU_BIND=${binding%%$'\n'*}
        echo "[sbatch] local rank i next to GPU i (nvidia-smi topo -m): ${binding#*$'\n'}"
    fi
fi
export CUDA_DEVICE_ORDER=PCI_BUS_ID
echo "[sbatch] srun --cpus-per-task=$CPUS_PER_TASK --cpu-bind=$CPU_BIND;" \
     "every GPU of its node visible to each rank, its local rank's used"
# Gradients are allreduced one tensor each as backward produces them (runtime.gradient_allreduce:
# overlap); Horovod's background thread fuses those ready in one cycle into one buffer of up to
# HOROVOD_FUSION_THRESHOLD bytes, Horovod 0.28's default written out so that the job's log says it and
# a site tunes it here (DeepCAM's 226 MB of fp32 gradients, when ready at once as under --xla, go in
# two). A CPU job over Gloo pays about 4x the buffer in peak RSS per rank (8388608 saved a DeepCAM K=2
# rank 0.5 GiB at the same speed on a 2-core AVX-512 EPYC: docs/figures.md); a GPU's NCCL reduces in
# the buffer in place.
export HOROVOD_FUSION_THRESHOLD=${HOROVOD_FUSION_THRESHOLD:-134217728}
# The thread starts a cycle every HOROVOD_CYCLE_TIME ms (Horovod 0.28's default: 1), and a gradient
# waits for the next cycle before its reduction can start: the last gradients of a GPU step of ~20 ms
# would wait up to 1 ms, 5% of it. A GPU node gets 0.1 ms, the value NVIDIA's MLPerf HPC CosmoFlow
# (MXNet with Horovod) sets on DGX A100 (mlcommons/hpc_results_v1.0, NVIDIA/benchmarks/cosmoflow/
# implementations/dgxa100_n512_ngc21.09_mxnet-weak/config_DGXA100_common.sh) and HPE+LBNL's on
# Perlmutter's A100s (hpc_results_v3.0, cosmoflow-mxnet-v1.0/configs/config_pm_common.sh); Horovod's
# docs name the knob and its autotuner, no value. The thread then wakes ten times as often, on host
# cores a GPU job leaves idle. CPU jobs keep 1 ms: there the thread's cycles take cores from the step
# (2 Gloo ranks: docs/figures.md), and runs with batch-norm groups get 0.1 ms from the launcher
# (docs/running.md). A value given here, or HOROVOD_AUTOTUNE, is kept.
if [[ -z "${HOROVOD_CYCLE_TIME:-}" && "${HOROVOD_AUTOTUNE:-0}" == 0 ]] && command -v nvidia-smi >/dev/null &&
        grep -q '^GPU [0-9]' <<< "$(nvidia-smi -L 2>/dev/null)"; then
    export HOROVOD_CYCLE_TIME=0.1
    cycle_why=" (a GPU node)"
fi
# TensorFlow launches each GPU's kernels from threads of its own (TF_GPU_THREAD_MODE=gpu_private),
# so the input pipeline's threads on the rank's few cores do not delay a step's launches.
export TF_GPU_THREAD_MODE=${TF_GPU_THREAD_MODE:-gpu_private}
cycle_said="as the launcher sets it ([init] line)"
[[ -z "${HOROVOD_CYCLE_TIME:-}" ]] || cycle_said="$HOROVOD_CYCLE_TIME ms${cycle_why:-}"
echo "[sbatch] Horovod fusion threshold $HOROVOD_FUSION_THRESHOLD B, cycle $cycle_said; TF_GPU_THREAD_MODE=$TF_GPU_THREAD_MODE"

# srun with every rank killed if one fails (no rank left waiting in a collective).
run_ranks() {
    srun --mpi="$SRUN_MPI" --kill-on-bad-exit=1 --cpus-per-task="$CPUS_PER_TASK" --cpu-bind="$CPU_BIND" "$@"
}

# Preemption. The scripts ask SLURM for SIGUSR1 a grace time before the wall-time limit
# (#SBATCH --signal=USR1@GRACE) and may be requeued (#SBATCH --requeue). On SIGUSR1 (or
# SIGTERM) the ranks agree, write a checkpoint and exit with 75 (common/run/termination.py);
# the script then requeues its job, and the requeued job goes on from that checkpoint.
EXIT_PREEMPTED=75

# --resume when this job was requeued and DIR already holds a checkpoint.
resume_args() {  # RUN_DIR
    if (( ${SLURM_RESTART_COUNT:-0} > 0 )) && compgen -G "$1/checkpoints/step-*" >/dev/null; then
        echo "--resume"
    fi
}

# Requeues this job when its run stopped with a checkpoint: exit 75, or a summary.json written
# by this run (newer than RUN_DIR/.started) that says so, for a rank ended by srun after the
# others stopped may report another code.
mark_run_start() {  # RUN_DIR
    mkdir -p "$1" && touch "$1/.started"
}
requeue_if_preempted() {  # EXIT_CODE RUN_DIR
    if [[ -n "${SLURM_JOB_ID:-}" ]] && { (( $1 == EXIT_PREEMPTED )) || { [[ "$2/summary.json" -nt "$2/.started" ]] &&
            grep -qs '"status": "preempted"' "$2/summary.json"; }; }; then
        echo "[sbatch] run stopped with a checkpoint in $2/checkpoints: requeueing job $SLURM_JOB_ID" \
             "(restart $(( ${SLURM_RESTART_COUNT:-0} + 1 )))"
        scontrol requeue "$SLURM_JOB_ID"
    fi
}

# The benchmark table (common/benchmarks.py) holds each benchmark's train script and flags.
# Sets TRAIN_SCRIPT, DATA_FLAG, OUTPUT_FLAG and STAGE_FLAG for BENCH.
read_benchmark() {  # BENCH
    local fields
    fields=$("${PYTHON[@]}" -m common.benchmarks get "$1" train_script data_flag output_flag stage_flag)
    # shellcheck disable=SC2034  # read by the sbatch scripts that source this file
    { read -r TRAIN_SCRIPT; read -r DATA_FLAG; read -r OUTPUT_FLAG; read -r STAGE_FLAG; } <<< "$fields"
}

# A set's folder in the submission layout, OUTPUT/<org>/results/<system>/<scaling>/<benchmark>,
# as offline/result_set.py names it: <org> is the config's mlperf.org unless ORG is set.
submission_folder() {  # OUTPUT_DIR CONFIG BENCH SYSTEM SCALING
    "${PYTHON[@]}" -m offline.run_logs folder "$1" "$2" "$3" --system "$4" --scaling "$5" ${ORG:+--org "$ORG"}
}

# Sets CONFIG and CONFIG_ARGS (the config and its train.py overrides) for a job of RANKS ranks and
# says them: CONFIG when set, else `python -m common.benchmarks job-config`'s choice. A closed config
# holds the hyperparameters of one RCP global batch and the launch its header names; fewer ranks reach
# that global batch by gradient accumulation (one node of 4 GPUs runs DeepCAM's 128 as 4 x local
# batch 4 x 8), more by a smaller local batch. Where no RCP global batch fits the ranks, the nearest
# closed config runs as open division. Nothing here stops a job before srun.
job_config() {  # BENCH RANKS
    if [[ -n "${CONFIG:-}" ]]; then
        CONFIG_ARGS=("$CONFIG")
        echo "[sbatch] config: $CONFIG (CONFIG)"
        return
    fi
    local lines
    lines=$("${PYTHON[@]}" -m common.benchmarks job-config "$1" "$2")
    mapfile -t CONFIG_ARGS <<< "$lines"
    echo "[sbatch] config: ${CONFIG_ARGS[0]}${CONFIG_ARGS[2]:+ (${CONFIG_ARGS[*]:2})}"
    CONFIG_ARGS=("${CONFIG_ARGS[@]:1}")
    CONFIG=${CONFIG_ARGS[0]}
}
