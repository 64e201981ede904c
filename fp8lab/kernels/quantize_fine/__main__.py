"""`python -m fp8lab.kernels.quantize_fine`: check every kernel, then time it on a GPU (fp8lab bench quantize_fine)."""

import sys

from . import main

sys.exit(main())
