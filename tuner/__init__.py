"""The optuna loop, GPU timing in isolated workers, baselines, shared work lists and model
tuning (its spaces, transfers and suites are the policy floor's, ``epilab.policy``)."""
