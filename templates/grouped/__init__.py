"""Grouped matmuls (MoE experts): the kind, its dual twin, geometry and spec format."""
