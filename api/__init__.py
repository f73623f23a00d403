"""The functions users call directly: ``epilab.matmul``, ``gated_matmul``, ``grouped_matmul``."""
