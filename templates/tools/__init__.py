"""Tools over compiled kernels: cross-compiling for a GPU this machine lacks, reading SASS."""
