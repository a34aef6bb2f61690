"""The compressors' fused kernels: SIDCo's and the selection's native C kernels on a CPU (their
source, build and cache) and SIDCo's Triton kernels on a GPU."""
