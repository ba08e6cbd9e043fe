"""DeepCAM training step, this project against the MLPerf PyTorch reference, on the same CPU.

  python bench/deepcam_vs_reference.py --torch-python /tmp/torchvenv/bin/python \\
      --reference-model /tmp/refcheck/deeplab_xception.py                 # 192x288 and 768x1152
  python bench/deepcam_vs_reference.py --sizes 192x288 --steps 3 --rounds 2 --sides ours
  python bench/deepcam_vs_reference.py --sides baseline,ours,reference --baseline-repo /tmp/before ...
  python bench/deepcam_vs_reference.py --sizes 192x288 --profile ours     # top ops by self time
  python bench/deepcam_vs_reference.py --sizes 192x288 --profile onednn   # oneDNN primitives (ONEDNN_VERBOSE)
  python bench/deepcam_vs_reference.py --sizes 192x288 --profile reference --torch-python ...

Times one whole training step (forward, backward, optimizer update), fp32, batch 1,
the full 56,454,720-parameter model, random normalized input and random labels:
  - ours: the model, loss and optimizer as training builds them (DeepCAMTask with
    the closed config: LAMB, weighted cross-entropy) inside common.run.steps.TrainStep,
    with a one-process distribution; mixed precision off. The batch enters as
    the model's input (the config's stats.h5 normalization is not part of the step);
  - reference: DeepLabv3_plus from the MLCommons file given by --reference-model,
    its weighted cross-entropy, and LAMB with apex FusedLAMB's math written with
    torch._foreach ops (apex's fused kernel is CUDA-only), or torch's AdamW.
Each side runs in its own subprocess with the same thread count (TF intra-op
threads, torch.set_num_threads), the two alternating A/B/A/B for --rounds rounds;
each run takes --warmup untimed steps then times --steps steps. Prints the median
over all timed steps of each side in samples/s, the ratio ours / reference, and
the CPU model (lscpu). This script imports neither TensorFlow nor torch itself:
the reference side runs under --torch-python.
"""

import argparse
import collections
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "deepcam" / "configs" / "deepcam_closed_gbs1024.yaml"
IN_CHANNELS = 16
N_CLASSES = 3
OUTPUT_STRIDE = 16
TOP_OPS = 25


def _size(text: str) -> tuple[int, int]:
    height, width = (int(v) for v in text.lower().split("x"))
    if height % OUTPUT_STRIDE or width % OUTPUT_STRIDE:
        raise argparse.ArgumentTypeError(f"{text}: both sides must be multiples of {OUTPUT_STRIDE}")
    return height, width


# ------------------------------------------------------------------ the two sides (run in subprocesses)
def _random_batch(height, width, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.random(
        (1, height, width, IN_CHANNELS), dtype=np.float32
    )  # normalized fields lie in [0, 1]
    y = rng.integers(0, N_CLASSES, (1, height, width), dtype=np.int32)
    return x, y


def _ours(args) -> dict:
    """Builds the training step as deepcam/train.py does, runs it; returns the step times (s)."""
    import tensorflow as tf

    from common.config import load_config
    from common.run.steps import TrainStep
    from deepcam.config import DeepCAMConfig
    from deepcam.task import DeepCAMTask

    class _OneProcess:
        """The Distribution of one process (tests/helpers.SingleProcess): nothing to average."""

        size = 1

        @staticmethod
        def average_gradients(grads, compression="none", grouped=False):
            del compression
            return grads

    # data.data_dir is required by validation but never read: the step takes the batch directly.
    cfg = load_config(
        DeepCAMConfig,
        args.config,
        {
            "data.data_dir": "unused",
            "data.height": args.height,
            "data.width": args.width,
            "data.local_batch_size": 1,
            "runtime.amp": False,
            "mlperf.division": "open",
        },
    )
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(cfg.runtime.inter_op_threads)
    task = DeepCAMTask(cfg)
    net = task.build_model(None)
    optimizer, _ = task.build_optimizer(1, 1)
    step = TrainStep(net, optimizer, task.build_losses(), _OneProcess())
    x, y = (tf.constant(a) for a in _random_batch(args.height, args.width))
    batches = iter(lambda: (x, y), None)
    for _ in range(args.warmup):
        float(step(batches).loss)
    times = []
    if args.profile_dir:
        tf.profiler.experimental.start(args.profile_dir)
    for _ in range(args.steps):
        start = time.perf_counter()
        float(step(batches).loss)
        times.append(time.perf_counter() - start)
    if args.profile_dir:
        tf.profiler.experimental.stop()
    return {
        "times": times,
        "parameters": int(sum(v.shape.num_elements() for v in net.trainable_variables)),
        "tensors": len(net.trainable_variables),
    }


def _torch_lamb_step(params, state, lr, betas, eps, weight_decay, max_grad_norm, step):
    """One apex FusedLAMB step (bias correction, grad averaging, global norm clipping, trust ratio
    when weight decay is on), with torch._foreach ops over all tensors at once."""
    import torch

    grads = [p.grad for p in params]
    b1, b2 = betas
    global_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    clip = max(float(global_norm) / max_grad_norm, 1.0) if max_grad_norm else 1.0
    grads = torch._foreach_div(grads, clip)
    m, v = (
        state.setdefault("m", [torch.zeros_like(p) for p in params]),
        state.setdefault("v", [torch.zeros_like(p) for p in params]),
    )
    torch._foreach_mul_(m, b1)
    torch._foreach_add_(m, grads, alpha=1 - b1)
    torch._foreach_mul_(v, b2)
    torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
    denom = torch._foreach_sqrt(v)
    torch._foreach_div_(denom, (1 - b2**step) ** 0.5)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(m, denom)
    torch._foreach_div_(update, 1 - b1**step)
    if weight_decay:
        torch._foreach_add_(update, params, alpha=weight_decay)
        w_norm = torch.stack(torch._foreach_norm(params))
        u_norm = torch.stack(torch._foreach_norm(update))
        ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        torch._foreach_mul_(update, (lr * ratio).tolist())
    else:
        torch._foreach_mul_(update, lr)
    torch._foreach_sub_(params, update)


def _reference(args) -> dict:
    """The MLCommons model, loss and optimizer in PyTorch; returns the step times (s)."""
    import importlib.util

    import torch
    import torch.nn.functional as F

    spec = importlib.util.spec_from_file_location("deeplab_xception", args.reference_model)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = ref.DeepLabv3_plus(
        n_input=IN_CHANNELS, n_classes=N_CLASSES, os=OUTPUT_STRIDE, _print=False
    ).train()
    # The reference tiles the pooled ASPP branch to its 768x1152 feature map (48x72);
    # at another size the tile is that size's feature map (the same computation).
    net.bottleneck.tiles = (1, 1, args.height // OUTPUT_STRIDE, args.width // OUTPUT_STRIDE)
    x, y = _random_batch(args.height, args.width)
    x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(y).long()
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    # The reference's loss: class weights f_c^-0.125 (deepcam.task.CLASS_FREQUENCIES), mean over pixels.
    frequencies = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
    weight = torch.tensor([f**-0.125 for f in frequencies])
    params = [p for p in net.parameters() if p.requires_grad]
    hyper = dict(lr=0.004, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    adamw = (
        torch.optim.AdamW(params, foreach=True, **hyper)
        if args.reference_optimizer == "adamw"
        else None
    )
    state, n = {}, [0]

    def one_step():
        for p in params:
            p.grad = None
        loss = F.cross_entropy(net(x), y, weight=weight, reduction="none").mean()
        loss.backward()
        with torch.no_grad():
            if adamw is not None:
                adamw.step()
            else:
                n[0] += 1
                _torch_lamb_step(params, state, max_grad_norm=1.0, step=n[0], **hyper)
        return float(loss)

    for _ in range(args.warmup):
        one_step()
    times = []
    profiler = None
    if args.profile_dir:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        profiler.__enter__()
    for _ in range(args.steps):
        start = time.perf_counter()
        one_step()
        times.append(time.perf_counter() - start)
    out = {"times": times, "parameters": sum(p.numel() for p in params), "tensors": len(params)}
    if profiler is not None:
        profiler.__exit__(None, None, None)
        out["top_ops"] = [
            (e.key, e.self_cpu_time_total / 1e6 / args.steps, e.count // args.steps)
            for e in sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)[:TOP_OPS]
        ]
    return out


# ------------------------------------------------------------------ TF profile: self time per op type
def tf_top_ops(profile_dir: str, steps: int) -> list:
    """(op type, seconds of self time per step, calls per step) from a TF profiler trace, most first.

    Times are thread time: ops that run at once on the inter-op threads add up.

    Reads the XSpace the profiler wrote: on each host thread, an event's self
    time is its duration less that of the events nested in it (a tf.function
    call holds its ops), summed by op type (the part after ':' in 'name:type').
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    totals, counts = collections.Counter(), collections.Counter()
    for path in Path(profile_dir).rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            if plane.name != "/host:CPU":
                continue
            names = {i: m.name for i, m in plane.event_metadata.items()}
            for line in plane.lines:
                # Ops are traced as 'name:type'; the executor's own events ('FunctionRun::Run',
                # 'ExecutorState::Process') are not ops.
                events = sorted(
                    (
                        (e.offset_ps, e.duration_ps, names[e.metadata_id])
                        for e in line.events
                        if _is_op(names.get(e.metadata_id, ""))
                    ),
                    key=lambda e: (e[0], -e[1]),
                )
                stack = []  # [end, name, self time]
                for start, duration, name in events:
                    while stack and stack[-1][0] <= start:
                        _close(stack.pop(), totals, counts)
                    if stack:
                        stack[-1][2] -= duration
                    stack.append([start + duration, name, duration])
                while stack:
                    _close(stack.pop(), totals, counts)
    return [(op, ps / 1e12 / steps, counts[op] // steps) for op, ps in totals.most_common(TOP_OPS)]


def _is_op(name: str) -> bool:
    return ":" in name and "::" not in name


def _close(entry, totals, counts):
    op = entry[1].rsplit(":", 1)[-1]
    totals[op] += entry[2]
    counts[op] += 1


def onednn_primitives(text: str, steps: int) -> list:
    """(primitive kind, implementation, pass, ms per step, calls per step) from ONEDNN_VERBOSE=1 output."""
    totals, counts = collections.Counter(), collections.Counter()
    for line in text.splitlines():
        fields = line.split(",")
        if (
            len(fields) < 6
            or not fields[0].startswith("onednn_verbose")
            or "exec" not in fields[1:3]
        ):
            continue
        at = fields.index("exec")
        try:
            ms = float(fields[-1])
        except ValueError:
            continue
        key = (fields[at + 2], fields[at + 3], fields[at + 4])  # kind, implementation, propagation
        totals[key] += ms
        counts[key] += 1
    return [(*key, ms / steps, counts[key] // steps) for key, ms in totals.most_common(TOP_OPS)]


# ------------------------------------------------------------------ the parent: A/B runs and the table
def _child_command(args, side: str, size, profile_dir: str = "") -> list:
    python = args.torch_python if side == "reference" else sys.executable
    script = (
        Path(args.baseline_repo, "bench", Path(__file__).name) if side == "baseline" else __file__
    )
    child = "ours" if side == "baseline" else side
    cmd = [
        python,
        script,
        "--child",
        child,
        "--sizes",
        f"{size[0]}x{size[1]}",
        "--threads",
        str(args.threads),
        "--config",
        str(args.config),
        "--reference-model",
        str(args.reference_model),
        "--reference-optimizer",
        args.reference_optimizer,
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps_for(size)),
    ]
    if args.channels_last:
        cmd.append("--channels-last")
    if profile_dir:
        cmd += ["--profile-dir", profile_dir]
    return cmd


def _busy_cpu_seconds() -> float:
    """CPU seconds spent busy by the whole machine since boot (/proc/stat), all processes."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (
            int(v) for v in f.readline().split()[1:9]
        )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wait_until_quiet(limit_s: float, busy_below: float = 0.1, sample_s: float = 3.0) -> float:
    """Waits (at most limit_s) until the other processes use under `busy_below` of the CPUs; returns the last share.

    On a shared machine the reference suffers more than we do from others' load
    (its OpenMP threads wait on each other at every barrier), so a ratio
    measured under load says little.
    """
    deadline = time.monotonic() + limit_s
    while True:
        before = _busy_cpu_seconds()
        time.sleep(sample_s)
        share = (_busy_cpu_seconds() - before) / (sample_s * os.cpu_count())
        if share < busy_below or time.monotonic() > deadline:
            return share


def _run_child(args, side, size, profile_dir="", extra_env=None) -> tuple[dict, str]:
    """Runs one side in a subprocess; its result carries `others`: the share of the CPUs that
    processes other than the child used while it ran (0: the machine was the child's alone)."""
    repo = args.baseline_repo if side == "baseline" else REPO
    env = dict(
        os.environ,
        TF_ENABLE_ONEDNN_OPTS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=str(repo),
        OMP_NUM_THREADS=str(args.threads),
        **(extra_env or {}),
    )
    if args.wait_quiet:
        _wait_until_quiet(args.wait_quiet)
    busy, own, start = _busy_cpu_seconds(), _children_cpu_seconds(), time.monotonic()
    proc = subprocess.run(
        _child_command(args, side, size, profile_dir), env=env, capture_output=True, text=True
    )
    others = (_busy_cpu_seconds() - busy) - (_children_cpu_seconds() - own)
    marker = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not marker:
        sys.exit(
            f"{side} at {size[0]}x{size[1]} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    result = json.loads(marker[-1][len("RESULT ") :])
    result["others"] = max(0.0, others) / ((time.monotonic() - start) * os.cpu_count())
    return result, proc.stdout


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown (no lscpu)"
    found = re.search(r"^Model name:\s*(.+)$", out, re.M)
    return found.group(1).strip() if found else "unknown"


def _compare(args) -> None:
    sides = args.sides.split(",")
    rows = []
    for size in args.sizes:
        times = {side: [] for side in sides}
        others = 0.0
        for round_ in range(args.rounds):
            for side in sides:
                result, _ = _run_child(args, side, size)
                times[side] += result["times"]
                others = max(others, result["others"])
                print(
                    f"[bench] {size[0]}x{size[1]} round {round_ + 1} {side}: "
                    f"{' '.join(f'{t:.2f}' for t in result['times'])} s/step "
                    f"({result['parameters']:,} parameters in {result['tensors']} tensors; other processes "
                    f"used {100 * result['others']:.0f}% of the CPUs meanwhile)",
                    flush=True,
                )
        rates = {side: 1.0 / statistics.median(t) for side, t in times.items()}
        rows.append((size, rates, {side: len(t) for side, t in times.items()}, others))
    print(
        f"\nDeepCAM train step, fp32, batch 1, {args.threads} threads per side, median of "
        f"{args.rounds} interleaved run(s) per side; CPU {cpu_model()}; reference optimizer: "
        f"{'LAMB (apex FusedLAMB math, torch._foreach)' if args.reference_optimizer == 'lamb' else 'torch AdamW'}"
        f"{', channels_last' if args.channels_last else ''}"
    )
    baseline = "baseline" in sides
    print(
        f"{'size':>10} {'ours samples/s':>15} {'reference samples/s':>20} {'ours / reference':>17} "
        + (f"{'baseline samples/s':>19} {'baseline / ref.':>16} " if baseline else "")
        + f"{'steps timed':>12} {'others, max':>12}"
    )
    for size, rates, n, others in rows:
        ours, reference = rates.get("ours"), rates.get("reference")
        ratio = f"{ours / reference:.2f}x" if ours and reference else "-"
        line = f"{size[0]}x{size[1]:<5} {ours or float('nan'):>15.3f} {reference or float('nan'):>20.3f} {ratio:>17} "
        if baseline:
            base = rates["baseline"]
            line += f"{base:>19.3f} {f'{base / reference:.2f}x' if reference else '-':>16} "
        print(line + f"{'/'.join(str(v) for v in n.values()):>12} {100 * others:>11.0f}%")
    print("(others, max: the largest share of the CPUs that other processes used during one run)")


def _profile(args) -> None:
    import tempfile

    size = args.sizes[0]
    steps = args.steps_for(size)
    if args.profile == "onednn":
        result, stdout = _run_child(args, "ours", size, extra_env={"ONEDNN_VERBOSE": "1"})
        # Warm-up steps execute the same primitives: count every step.
        print(
            f"oneDNN primitives, ours at {size[0]}x{size[1]}, ms per step (of {args.warmup + steps} steps):"
        )
        for kind, impl, prop, ms, calls in onednn_primitives(stdout, args.warmup + steps):
            print(f"  {ms:9.1f} ms  {calls:5d}x  {kind:<14} {prop:<18} {impl}")
        return
    with tempfile.TemporaryDirectory() as profile_dir:
        side = "ours" if args.profile == "ours" else "reference"
        result, _ = _run_child(args, side, size, profile_dir)
        top = tf_top_ops(profile_dir, steps) if side == "ours" else result["top_ops"]
    step_s = statistics.median(result["times"])
    print(
        f"Top ops by self time, {side} at {size[0]}x{size[1]}, per step (median step {step_s:.2f} s "
        f"under the profiler), CPU {cpu_model()}:"
    )
    for op, seconds, calls in top:
        print(f"  {seconds * 1e3:9.1f} ms  {100 * seconds / step_s:5.1f}%  {calls:5d}x  {op}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--sizes", type=lambda v: [_size(s) for s in v.split(",")], default="192x288,768x1152"
    )
    p.add_argument(
        "--steps", default="5,2", help="timed steps per run, one per size (or one for all)"
    )
    p.add_argument(
        "--warmup", type=int, default=2, help="untimed steps per run (the first one traces)"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="A/B rounds: each side runs this many times per size"
    )
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of each side")
    p.add_argument(
        "--sides",
        default="ours,reference",
        help="comma-separated, in the order run: ours, reference, baseline (ours from --baseline-repo)",
    )
    p.add_argument(
        "--baseline-repo",
        default="",
        help="a copy of this repository (e.g. before a change) whose "
        "model and optimizer run as the side 'baseline'",
    )
    p.add_argument(
        "--config", default=DEFAULT_CONFIG, help="our side's DeepCAM config (optimizer, model)"
    )
    p.add_argument("--torch-python", default="", help="a Python with torch, for the reference side")
    p.add_argument(
        "--reference-model",
        default="/tmp/refcheck/deeplab_xception.py",
        help="the MLCommons deeplab_xception.py",
    )
    p.add_argument("--reference-optimizer", choices=("lamb", "adamw"), default="lamb")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to this long for other processes to leave the CPUs idle",
    )
    p.add_argument(
        "--channels-last", action="store_true", help="reference in torch.channels_last (NHWC)"
    )
    p.add_argument(
        "--profile",
        choices=("ours", "onednn", "reference"),
        help="profile one run at the first size instead of comparing",
    )
    p.add_argument("--child", choices=("ours", "reference"), help=argparse.SUPPRESS)
    p.add_argument("--profile-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    steps = [int(s) for s in str(args.steps).split(",")]
    if len(steps) not in (1, len(args.sizes)):
        p.error(f"--steps: give one count, or one per size ({len(args.sizes)})")
    by_size = dict(zip(args.sizes, steps * len(args.sizes) if len(steps) == 1 else steps))
    args.steps_for = by_size.__getitem__
    if args.child:
        args.height, args.width = args.sizes[0]
        args.steps = args.steps_for(args.sizes[0])
        result = _ours(args) if args.child == "ours" else _reference(args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    if "baseline" in args.sides.split(",") and not args.baseline_repo:
        p.error("the side 'baseline' needs --baseline-repo")
    needs_torch = (
        "reference" in args.sides.split(",") if not args.profile else args.profile == "reference"
    )
    if needs_torch and not args.torch_python:
        p.error("the reference side needs --torch-python (a Python with torch)")
    if args.profile:
        _profile(args)
    else:
        _compare(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
