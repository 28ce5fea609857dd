"""Ensembles: the DAG of `ensemble_scheduling`, checked at load, run step by step through the data plane."""
