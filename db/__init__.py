"""The tuning database (SQLAlchemy): devices, problems, trial records, baselines.
Built by the database issue."""
