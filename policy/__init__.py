"""What the compiler and the tuner both decide by, with no GPU work: the search spaces and
their feasibility rules (``space``), config transfer from the nearest record (``nearest``),
problem suites, shapes files and labels (``suites``), and the roofline floors (``roofline``).
It sits above ``templates`` and ``db`` and below both ``compiler`` and ``tuner``."""
