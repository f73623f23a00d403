"""The language every layer speaks: problems, the epilogue IR, its rule table and patterns,
the epilogue parser, the catalog, dtypes and the output checks (docs/design.md, "Layout").

The ground floor: nothing here imports from templates/, compiler/, tuner/ or db/.
"""
