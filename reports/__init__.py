"""HTML reports of tuned versus library throughput, rendered from the database.
Built by the reports issue."""
