"""Ensembles: DAG pipelines from ensemble_scheduling, run through the data plane (not built yet)."""
