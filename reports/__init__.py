"""HTML reports of tuned versus library throughput, rendered from the database:
``data.collect`` gathers a device's problems, best configs, baselines and failures;
``html.write`` renders ``report.html.jinja`` with the ``plots`` inlined. ``epilab
report`` is the command line."""
