"""General matrix multiplies: the matmul kind (pointer and TMA kernels, split-K, stream-K), its
Gluon twin for Hopper, the dual (gated) and block-scaled kinds, weight-only quantized kinds and
the spec format of GEMM shapes files."""
