"""Train CosmoFlow.

python cosmoflow/train.py cosmoflow/configs/cosmoflow_synthetic_cpu.yaml --data-dir data/cosmo
horovodrun -np 4 python cosmoflow/train.py [CONFIG] ...      # or mpirun / srun
"""

import os
import sys
from pathlib import Path

# Run from a checkout without installing: make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# TensorFlow reads this at import; INFO lines from every rank drown the progress output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from common.run.trainer import main  # noqa: E402
from cosmoflow.task import CosmoFlowTask  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(CosmoFlowTask))
