"""Train DeepCAM.

python deepcam/train.py deepcam/configs/deepcam_synthetic_cpu.yaml --data_dir_prefix data/deepcam
horovodrun -np 4 python deepcam/train.py [CONFIG] ...      # or mpirun / srun
"""

import os
import sys
from pathlib import Path

# Run from a checkout without installing: make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# TensorFlow reads this at import; INFO lines from every rank drown the progress output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from common.run.trainer import main  # noqa: E402
from deepcam.task import DeepCAMTask  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(DeepCAMTask))
