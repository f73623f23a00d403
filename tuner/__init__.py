"""Search spaces, the optuna loop, GPU timing in isolated workers, baselines and
problem suites. Built by the tuner issue."""
