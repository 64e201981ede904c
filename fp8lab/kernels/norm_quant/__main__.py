"""`python -m fp8lab.kernels.norm_quant`: the package's checks, then (on a GPU) its timings."""

from fp8lab.kernels.norm_quant import main

main()
