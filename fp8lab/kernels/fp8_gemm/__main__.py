"""python -m fp8lab.kernels.fp8_gemm: check every version, then time it on a GPU (fp8lab bench fp8_gemm)."""

import sys

from . import main

sys.exit(main())
