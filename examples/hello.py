# A first job: runs in Kiln's sandbox (no network, read-only root, uid 65534).
import platform
import sys

import numpy as np

print(f"hello from {platform.node()} (python {sys.version.split()[0]}, numpy {np.__version__})")
print("mean of 1..100 =", np.arange(1, 101).mean())
