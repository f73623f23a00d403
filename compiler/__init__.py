"""The torch.compile backend: FX matching (ATen graph -> epilogue IR, ``match``),
decisions from the tuning database (``decide``), the custom op ``epilab::template_call``
(``op``), the Inductor pass (``graph_pass``), the backend itself (``backend``) and the
decision log behind ``epilab.explain()`` (``explain``)."""
