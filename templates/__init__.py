"""Kernel templates, a folder per family (gemm, gemv, conv, grouped) holding its kinds, Jinja
files, geometry and spec format; ``kind.py`` says what a kind is (``bound.py``: what its ``bind``
returns), ``registry.py`` lists them, ``verify.py`` checks a launch against its reference;
``runtime/`` is the path every launch runs through (render, build, binding, replay);
``tools/`` reads and cross-compiles kernels. The Jinja files every kind's epilogue
shares sit here."""
