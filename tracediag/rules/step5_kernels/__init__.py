"""Walk step 5, kernels: attention and GEMM dispatch, roofline, host-bound decode, cold windows and copies."""
