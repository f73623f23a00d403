"""Convolutions: conv2d (implicit GEMM) and depthwise, their geometry and spec format."""
