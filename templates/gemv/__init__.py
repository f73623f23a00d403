"""Matrix-vector products: gemv, its dual (gated) twin and weight-only gemv."""
